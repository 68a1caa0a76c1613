"""The wire contract's error table: each code is defined once, every class renders."""

from __future__ import annotations

import inspect

from edgefire.contract import errors
from edgefire.contract.errors import EdgefireError
from edgefire.contract.http_errors import error_body

ERROR_CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, EdgefireError) and cls is not EdgefireError]


def test_each_code_is_defined_by_one_class():
    # A class that states a code its parent does not have is where that code is defined.
    owners: dict[int, list[str]] = {}
    for cls in ERROR_CLASSES:
        parent = cls.__mro__[1]
        if cls.code != getattr(parent, "code", None):
            owners.setdefault(cls.code, []).append(cls.__name__)
    assert {code: names for code, names in owners.items() if len(names) > 1} == {}


def test_every_error_has_a_client_status_and_renders_in_both_styles():
    for cls in ERROR_CLASSES:
        error = cls(404) if cls is errors.RouteError else cls()
        assert 400 <= error.status < 600 and error.message
        envelope = error_body(error, openai=False)
        assert envelope["errors"] == [{"code": error.code, "message": error.message}]
        assert error_body(error, openai=True)["error"]["code"] == str(error.code)


def test_no_error_class_lives_outside_the_contract():
    import edgefire.gateway.app  # noqa: F401  (imports every gateway module that answers)
    import edgefire.runtime.server.app  # noqa: F401

    def subclasses(cls: type) -> set[type]:
        return {sub for direct in cls.__subclasses__() for sub in {direct, *subclasses(direct)}}

    # Tests may define their own to exercise the handlers; the code may not.
    stray = {cls.__module__ + "." + cls.__name__ for cls in subclasses(EdgefireError)
             if not cls.__module__.startswith(("edgefire.contract.errors", "tests."))}
    assert stray == set()
