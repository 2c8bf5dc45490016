"""SIE's input items (``{id?, text, images?, ...}``) as the text engines here read them."""

from __future__ import annotations

from dataclasses import dataclass

from sie_worker.sie_api.fields import bad, object_at, optional_str

__all__ = ["Item", "parse_item", "parse_items"]

_NOT_TEXT = ("images", "audio", "video", "document", "multivector")
_KNOWN = frozenset({"id", "text", "metadata", *_NOT_TEXT})


@dataclass(frozen=True)
class Item:
    id: str | None
    text: str


def parse_item(value: object, field: str) -> Item:
    data = object_at(value, field)
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise bad(f"{field}.{unknown[0]}", "is not an item field; items have id, text, metadata")
    for key in _NOT_TEXT:
        if data.get(key) is not None:
            raise bad(
                f"{field}.{key}",
                "the models served here read text only (inputs: text); send the item's text",
            )
    text = optional_str(data, "text", f"{field}.text")
    if text is None:
        raise bad(f"{field}.text", "required: the item's text")
    return Item(id=optional_str(data, "id", f"{field}.id"), text=text)


def parse_items(value: object, field: str) -> tuple[Item, ...]:
    if not isinstance(value, list) or not value:
        raise bad(field, "required: a nonempty list of items ({id?, text})")
    return tuple(parse_item(item, f"{field}[{i}]") for i, item in enumerate(value))
