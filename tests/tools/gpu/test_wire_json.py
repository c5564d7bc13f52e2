"""wire.json_object: the one reader of hostile JSON lines (the guard's children, runners, tools).
Nesting is refused before json.loads recurses; a line never raises."""

from __future__ import annotations

import json

import pytest

from harnesslab.tools.gpu import wire


def nested(levels: int) -> str:
    """An object whose value nests `levels` lists: depth levels + 1."""
    return '{"a": ' + "[" * levels + "]" * levels + "}"


def test_a_line_nested_to_the_limit_is_read_and_one_deeper_is_refused():
    assert wire.json_object(nested(wire.MAX_DEPTH - 1)) == json.loads(nested(wire.MAX_DEPTH - 1))
    assert wire.json_object(nested(wire.MAX_DEPTH)) is None


def test_nesting_is_refused_before_json_loads_sees_it(monkeypatch):
    seen: list[int] = []
    real = json.loads
    monkeypatch.setattr(wire.json, "loads", lambda raw: seen.append(len(raw)) or real(raw))
    assert wire.json_object(nested(100_000)) is None
    assert wire.json_object("[" * 1_000_000) is None
    assert seen == []
    with pytest.raises(wire.WireError, match="nesting"):
        wire.decode(nested(100_000).encode())


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not json",
        "[1, 2]",
        '"a string"',
        "1" * 5000,  # an int past Python's 4300-digit conversion limit: ValueError, not JSON's
        '{"a": ' + "1" * 5000 + "}",
        '{"a": [}',
        '{"a": "' + "]" * 100 + '"',  # unterminated
    ],
)
def test_anything_but_a_json_object_is_none_never_an_exception(line):
    assert wire.json_object(line) is None


def test_brackets_and_escaped_quotes_inside_strings_do_not_count_as_nesting():
    deep_text = {"s": "[" * 500 + '\\"' + "{" * 500, "t": 'a\\"[[[', "u": "\\\\"}
    line = json.dumps(deep_text)
    assert wire.json_object(line) == deep_text
    assert not wire.too_deep(b'["\\\\", [[]]]', 3) and wire.too_deep(b'["\\\\", [[]]]', 2)


def test_an_oversized_line_is_refused_unread():
    assert wire.json_object('{"a": "' + "x" * 100 + '"}', max_bytes=64) is None
    assert wire.json_object('{"a": 1}', max_bytes=64) == {"a": 1}


def test_lines_of_millions_of_brackets_quotes_and_escapes_are_answered():
    """The check is linear passes in C (escapes, strings, then rounds of innermost pairs), so
    these come back; a line with more than MAX_DEPTH brackets and more than MAX_STRINGS strings
    is refused outright (checking it would cost seconds)."""
    assert wire.json_object(b"[" * 20_000_000) is None
    assert wire.json_object(b'"' + b'\\"' * 10_000_000) is None
    assert wire.json_object(b'["' * 10_000_000) is None
    many = b'{"a": [' + b'"x",' * (wire.MAX_STRINGS // 2) + b'"x"], "b": [[1]]}'
    assert wire.json_object(many)["b"] == [[1]]
    # With few brackets nothing can nest: parsed without the check; with more, refused.
    too_many = b'{"a": [' + b'"x",' * (wire.MAX_STRINGS + 1)
    assert wire.json_object(too_many + b"1]}") is not None
    assert wire.json_object(too_many + b"[]," * wire.MAX_DEPTH + b"1]}") is None
    # MAX_DEPTH openers (`{`, `[` and 62 more) cannot nest deeper: no check, read
    assert wire.json_object(too_many + b"[]," * (wire.MAX_DEPTH - 2) + b"1]}") is not None
    assert wire.json_object(too_many + b"[]," * (wire.MAX_DEPTH - 1) + b"1]}") is None


def test_a_checked_line_may_hold_two_mebi_strings_and_not_one_more():
    def line(strings: int) -> bytes:  # the keys "a" and "b", and a list of the rest
        items = b'"",' * (strings - 3) + b'""'
        return b'{"a": [' + items + b'], "b": ' + b"[" * 63 + b"]" * 63 + b"}"

    assert wire.json_object(line(2 << 20)) is not None  # 65 openers: the check runs
    assert wire.json_object(line((2 << 20) + 1)) is None


def test_a_line_of_64_mib_and_one_byte_is_refused_by_default():
    text = b'{"a": "' + b"x" * ((64 << 20) + 1 - 9) + b'"}'
    assert len(text) == (64 << 20) + 1
    assert wire.json_object(text) is None
    assert wire.json_object(text, max_bytes=len(text)) is not None


def test_a_line_of_exactly_the_limit_is_read():
    assert wire.json_object('{"a": 1}', max_bytes=8) == {"a": 1}
    assert wire.json_object('{"a": 1}', max_bytes=7) is None


def test_a_line_that_is_not_valid_unicode_is_read_with_its_bad_characters_replaced():
    lone = '{"a": "\ud800", "b": "\udc80x"}'  # lone surrogates: str.encode() would raise
    assert wire.json_object(lone) == {"a": "?", "b": "?x"}
