"""The tasks the catalog's models perform, as `/ai/models/*` shows them, with their JSON Schemas.

The schemas (edgefire.contract.schemas) are the ones requests are checked against: Workers
AI's with this engine's ranges.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from edgefire.contract.schemas import TASK_SCHEMAS, TEXT_EMBEDDINGS, TEXT_GENERATION


@dataclass(slots=True, frozen=True)
class Task:
    id: str  # Cloudflare's task UUID
    name: str
    description: str
    input_schema: dict | None = None  # None: no schema for this task here
    output_schema: dict | None = None


TASKS = {
    TEXT_GENERATION: Task(
        "c329a1f9-323d-4e91-b2aa-582dd4188d34", "Text Generation",
        "Family of generative text models, such as large language models (LLM), that can be "
        "adapted for a variety of natural language tasks.",
        *TASK_SCHEMAS[TEXT_GENERATION]),
    TEXT_EMBEDDINGS: Task(
        "0137cdcf-162a-4108-94f2-1ca59e8c65ee", "Text Embeddings",
        "Feature extraction models transform raw data into numerical features that can be "
        "processed while preserving the information in the original dataset.",
        *TASK_SCHEMAS[TEXT_EMBEDDINGS]),
}


def task_of(task_id: str) -> Task:
    """The task for a catalog task id; one this table lacks gets a stable id and no schema."""
    known = TASKS.get(task_id)
    if known is not None:
        return known
    name = task_id.replace("-", " ").title()
    return Task(str(uuid.uuid5(uuid.NAMESPACE_URL, f"edgefire:task:{task_id}")), name, "")
