"""The bounds of a durable task, shared by the store, its REST face and the task tools."""

from __future__ import annotations

#: The shortest cadence: a loop that fires more often than this is a busy-wait, not a task.
MIN_TASK_INTERVAL_S = 60
#: The longest cadence: a year.
MAX_TASK_INTERVAL_S = 366 * 24 * 3600
MAX_TASK_NAME_CHARS = 200
MAX_TASK_PROMPT_CHARS = 20_000
