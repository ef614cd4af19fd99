"""Turn a :class:`StepSnapshot` into an OpenAI Chat Completions request body.

Pure and deterministic: the same snapshot always yields the same payload, which is what
lets a pre-commit retry re-send exactly the admitted step (R-009). ``ChatMessage`` has no
thinking field, so thinking can never reach a payload (R-011).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kaizen_server_extension.protocol.model import ChatMessage, ModelStepError, StepSnapshot
from kaizen_server_extension.protocol.tools import AdvertisedTool

# Keys the gateway owns; ``GatewayConfig.extra_params`` may not override them.
RESERVED_KEYS = frozenset({"model", "messages", "stream", "stream_options", "tools", "tool_choice"})


def build_payload(snapshot: StepSnapshot, model: str, *, stream: bool = True) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "messages": [message_to_openai(m) for m in snapshot.messages],
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    tools = advertised_tools(snapshot)
    if tools:
        payload["tools"] = [tool_to_openai(t) for t in tools]
    # No tool_choice, even for a required tool: the narrow advertisement is all the provider
    # sees and the runtime enforces the requirement itself (spec: Tool discovery, R-303).
    return payload


def advertised_tools(snapshot: StepSnapshot) -> tuple[AdvertisedTool, ...]:
    """The tools this step may see: all of them, or only the required one."""
    if snapshot.required_tool is None:
        return snapshot.tools
    narrowed = tuple(t for t in snapshot.tools if t.name == snapshot.required_tool)
    if not narrowed:
        # Forcing a tool the catalog lacks would step outside the ceiling.
        raise ModelStepError("required_tool_not_in_catalog", retryable=False)
    return narrowed


def message_to_openai(message: ChatMessage) -> dict[str, Any]:
    # ``name`` is deliberately not sent: providers validate it against a narrow pattern
    # and reject the whole request for a member id that does not fit.
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def tool_to_openai(tool: AdvertisedTool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": to_plain_json(tool.parameters),
        },
    }


def to_plain_json(value: Any) -> Any:
    """Copy nested mappings/sequences into plain dicts/lists so ``json`` can encode them."""
    if isinstance(value, Mapping):
        return {str(k): to_plain_json(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [to_plain_json(v) for v in value]
    return value
