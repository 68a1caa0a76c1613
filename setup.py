"""Maps the design card's top-level folders into the one import name `edgefire`.

pyproject.toml holds everything else; only the package map lives here, because it is computed:
`edgefire.runtime` is the folder `runtime/`, and so on, so an installed edgefire claims a single
top-level name instead of six generic ones (`models`, `plugins`, …) that would shadow a user's own.
"""

from setuptools import find_packages, setup

FOLDERS = ("runtime", "models", "plugins", "gateway", "edge_nodes")

package_dir = {"edgefire": "edgefire"} | {f"edgefire.{folder}": folder for folder in FOLDERS}
packages = ["edgefire", *(f"edgefire.{sub}" for sub in find_packages("edgefire"))]
for folder in FOLDERS:
    packages.append(f"edgefire.{folder}")
    packages += [f"edgefire.{folder}.{sub}" for sub in find_packages(folder)]

setup(package_dir=package_dir, packages=packages)
