"""evolve and construct make the instance pydantic would: fields, order, fields set, equality."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, PrivateAttr

from contextfold.folds._evolve import construct, evolve


class Leaf(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    size: int = 0


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)
    offset: int
    label: str | None = None
    leaves: tuple[Leaf, ...] = ()
    pair: tuple[int, str] | None = None
    flag: bool = False


class Private(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: int = 0
    _seen: int = PrivateAttr(default=7)


class Extra(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    value: int = 0


fields: dict[str, st.SearchStrategy[Any]] = {
    "offset": st.integers(1, 10**6),
    "label": st.none() | st.text(max_size=5),
    "leaves": st.lists(st.builds(Leaf, name=st.text(max_size=3)), max_size=3).map(tuple),
    "pair": st.none() | st.tuples(st.integers(), st.text(max_size=3)),
    "flag": st.booleans(),
}
given_fields = st.fixed_dictionaries(
    {"offset": fields["offset"]}, optional={k: v for k, v in fields.items() if k != "offset"}
)
changes = st.fixed_dictionaries({}, optional=fields)


def _same(made: BaseModel, expected: BaseModel) -> None:
    assert type(made) is type(expected)
    assert list(made.__dict__.items()) == list(expected.__dict__.items())
    assert made.model_fields_set == expected.model_fields_set
    assert made.__pydantic_extra__ == expected.__pydantic_extra__
    assert made.__pydantic_private__ == expected.__pydantic_private__
    assert made == expected and hash(made) == hash(expected)
    assert made.model_dump() == expected.model_dump()


@given(given_fields, changes)
def test_evolve_is_model_copy_with_update(start: dict[str, Any], update: dict[str, Any]) -> None:
    model = Node(**start)
    before = list(model.__dict__.items()), set(model.model_fields_set)
    made = evolve(model, update)
    _same(made, model.model_copy(update=update))
    # The original and its fields set are left as they were.
    assert (list(model.__dict__.items()), model.model_fields_set) == before
    assert made.model_fields_set is not model.model_fields_set


@given(given_fields)
def test_construct_is_the_constructor_on_valid_values(given_values: dict[str, Any]) -> None:
    expected = Node(**given_values)
    values = {name: getattr(expected, name) for name in Node.model_fields}
    _same(construct(Node, values, set(given_values)), expected)


def test_models_with_private_attributes_or_extras_go_through_pydantic() -> None:
    private = Private(value=1)
    _same(evolve(private, {"value": 2}), private.model_copy(update={"value": 2}))
    assert evolve(private, {"value": 2})._seen == 7
    extra = Extra(value=1, more="kept")
    _same(evolve(extra, {"value": 2}), extra.model_copy(update={"value": 2}))
    assert evolve(extra, {"value": 2}).__pydantic_extra__ == {"more": "kept"}
    _same(construct(Private, {"value": 3}, {"value"}), Private(value=3))
