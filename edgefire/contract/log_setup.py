"""Console logging for the `edge-node` and `edge-gateway` commands.

Nodes report to the gateway every couple of seconds; one log line per heartbeat on each side
(httpx's request line in the node, uvicorn's access line in the gateway) would bury
everything else, so those lines are dropped. Failed heartbeats still log as warnings.
"""

from __future__ import annotations

import logging

from edgefire.contract.node_report import HEARTBEAT_PATH


class _DropHeartbeats(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return HEARTBEAT_PATH not in record.getMessage()


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in ("httpx", "uvicorn.access"):
        logging.getLogger(name).addFilter(_DropHeartbeats())
