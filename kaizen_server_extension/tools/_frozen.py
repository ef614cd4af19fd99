"""Deep-frozen JSON values: a frozen catalog must not be changeable through a nested dict.

The frozen types subclass ``dict`` and ``list`` (rather than being MappingProxyType/tuple) so
``json.dumps`` and jsonschema, whose ``object``/``array`` checks are ``isinstance(dict/list)``,
keep treating them as JSON objects and arrays.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable")


class FrozenDict(dict[str, Any]):
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    __setitem__ = __delitem__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse
    __iadd__ = __imul__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def deep_freeze(value: Any) -> Any:
    """A frozen copy of a JSON-like value (mappings → FrozenDict, sequences → FrozenList)."""
    if isinstance(value, dict | FrozenDict) or hasattr(value, "keys"):
        return FrozenDict({str(k): deep_freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(deep_freeze(v) for v in value)
    return value
