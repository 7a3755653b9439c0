"""Token counters: approx_tokens and TiktokenCounter with an encoding made by the test."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

import contextfold as cf

tiktoken = pytest.importorskip("tiktoken")


def byte_encoding() -> object:
    """One token per UTF-8 byte: no download, and counts anyone can check by hand."""
    return tiktoken.Encoding(
        name="bytes",
        pat_str=r"[\s\S]",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={},
    )


class Note(BaseModel):
    model_config = ConfigDict(frozen=True)
    text: str


def test_tiktoken_counter_counts_tokens_of_text_and_json() -> None:
    count = cf.TiktokenCounter(byte_encoding())
    assert count("abc") == 3
    assert count("") == 0
    assert count("é☃") == len("é☃".encode())  # 2 + 3 bytes: 5 tokens
    assert count("<|endoftext|>") == len("<|endoftext|>")  # special-looking text is plain text
    assert count({"b": 1, "a": [1, 2]}) == len(b'{"a":[1,2],"b":1}')  # sorted, compact JSON
    assert count(Note(text="hi")) == len(b'{"text":"hi"}')
    segment = cf.Segment("s1", {"kind": "user", "text": "hi"})
    assert count(segment) == len(b'{"data":{"kind":"user","text":"hi"},"id":"s1"}')


def test_tiktoken_counter_with_merges() -> None:
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 256  # one merge: "ab" is a single token
    encoding = tiktoken.Encoding(
        name="ab", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={}
    )
    count = cf.TiktokenCounter(encoding)
    assert count("ab") == 1
    assert count("abab c") == 2 + 1 + 1
    assert count("abc") == 2


def test_tiktoken_counter_in_a_view() -> None:
    fold = cf.SegmentedFold("tokfold", data=dict[str, str], summary=str, tag="kind")
    count = cf.TiktokenCounter(byte_encoding())
    view = cf.ContextView(fold, count=count, count_summary=count, strategies=[cf.drop_oldest()])
    state = cf.SegmentedState(
        [
            cf.Segment("a", {"kind": "user", "text": "x" * 10}),
            cf.Segment("b", {"kind": "user", "text": "y"}),
        ],
        summary="sum",
    )
    sizes = [count(s) for s in state.segments]
    result = view(state, budget=math.inf)
    assert result.tokens == sum(sizes) + 3
    trimmed = view(state, budget=sizes[1] + 3)
    assert [s.id for s in trimmed.state.segments] == ["b"] and trimmed.tokens == sizes[1] + 3


def test_approx_tokens_is_a_quarter_of_the_json_length() -> None:
    assert cf.approx_tokens("") == 1  # '""'
    assert cf.approx_tokens("abcdef") == 2  # '"abcdef"': 8 characters
    assert cf.approx_tokens({"a": "bcd"}) == math.ceil(len('{"a":"bcd"}') / 4)
    assert cf.approx_tokens(cf.Segment("x", Note(text="t"))) == math.ceil(
        len('{"data":{"text":"t"},"id":"x"}') / 4
    )
    assert cf.approx_tokens(cf.FrozenList([1, 2])) == cf.approx_tokens([1, 2])
    with pytest.raises(TypeError):
        cf.approx_tokens(object())


def test_an_encoding_that_cannot_be_downloaded_says_how_to_work_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    requests = pytest.importorskip("requests")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty: nothing cached
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # none loaded in this process

    def offline(url: str, *args: object, **kwargs: object) -> object:
        raise requests.exceptions.ConnectionError(f"cannot reach {url}")

    monkeypatch.setattr(requests, "get", offline)
    with pytest.raises(cf.ConfigurationError) as refused:
        cf.TiktokenCounter("o200k_base")
    message = str(refused.value)
    assert "'o200k_base'" in message and "could not be downloaded" in message
    assert "TIKTOKEN_CACHE_DIR" in message and "ConnectionError: cannot reach" in message
    assert isinstance(refused.value.__cause__, requests.exceptions.ConnectionError)


def test_an_unknown_encoding_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(cf.ConfigurationError, match=r"no encoding 'nope'; it knows .*cl100k_base"):
        cf.TiktokenCounter("nope")
