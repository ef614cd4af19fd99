"""The G4 grammar (HASHLINE.md §3) and its refusals (§11, input and hunk syntax)."""

from __future__ import annotations

import pytest

from kaizen_hashline import HashlineError, compute_tag, normalize, parse, xxh32
from kaizen_hashline.syntax import BlockLoc, GapLoc, Hunk, Move, Remove, SpanLoc
from kaizen_hashline.text import Lines, TextFormat, decode, detect_format
from tests.hashline.support import SETTINGS


def test_xxh32_standard_vectors_and_spec_tags():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"abc") == 0x32D153FF
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F
    assert [compute_tag(t) for t in ("", "hello\n", "a\nb\n", "a  \nb\t\n", SETTINGS)] == [
        "5D05", "5BF9", "9A46", "9A46", "BC00"]


def test_normalization_and_lines():
    assert normalize("\ufeffa\r\nb\rc\n") == "a\nb\nc\n"
    assert Lines.of("a\nb\n").rows == ("a", "b") and Lines.of("a\nb\n").final_newline
    assert Lines.of("a\nb").rows == ("a", "b") and not Lines.of("a\nb").final_newline
    assert Lines.of("").rows == ()
    assert Lines.of("\n").rows == ("",)
    assert detect_format("\ufeffa\r\nb\r\n") == TextFormat(bom=True, eol="crlf")
    assert detect_format("a\rb\r") == TextFormat(eol="cr")
    assert TextFormat(bom=True, eol="crlf").encode("a\nb\n") == b"\xef\xbb\xbfa\r\nb\r\n"
    with pytest.raises(HashlineError) as err:
        decode(b"\xff\xfe\x00")
    assert err.value.code == "not_text"


def only(text: str) -> list[Hunk | Remove | Move]:
    program = parse(text)
    assert len(program.sections) == 1
    return program.sections[0].items


def test_every_header_shape():
    items = only("[a.py#bc00]\n"
                 "PUT 3.=4:\n+x\n+y\n"
                 "PUT 6*:\n+z\n"
                 "PUT <2:\n+a\n"
                 "PUT >2:\n+b\n"
                 "PUT >$:\n+c\n"
                 "PUT >6*:\n+d\n"
                 "PUT <5\n"
                 "PUT >5 @r\n"
                 "PUT >$ @r\n"
                 "PUT >6* @r\n"
                 "PUT 1.=2 @r\n"
                 "PUT 6* @r\n"
                 "CUT 7.=8\n"
                 "CUT 6* @r\n"
                 "MV b.py\n")
    hunks = [i for i in items if isinstance(i, Hunk)]
    assert [h.render() for h in hunks] == [
        "PUT 3.=4:", "PUT 6*:", "PUT <2:", "PUT >2:", "PUT >$:", "PUT >6*:", "PUT <5",
        "PUT >5 @r", "PUT >$ @r", "PUT >6* @r", "PUT 1.=2 @r", "PUT 6* @r", "CUT 7.=8",
        "CUT 6* @r"]
    assert hunks[0].body == ["x", "y"] and hunks[0].locator == SpanLoc(3, 4)
    assert hunks[1].locator == BlockLoc(6)
    assert hunks[4].locator == GapLoc(">", None) and hunks[4].locator.tail
    assert hunks[5].locator == GapLoc(">", 6, block=True)
    assert hunks[6].paste and hunks[6].register is None
    assert hunks[10].paste and hunks[10].register == "r"
    assert isinstance(items[-1], Move) and items[-1].dest == "b.py"
    assert parse("[a.py#bc00]\nREM\n").sections[0].items == [Remove(2)]


def test_header_tag_is_upper_cased_and_path_may_have_spaces():
    section = parse("[my dir/a b.txt#1a2b]  \nCUT 1.=1\n").sections[0]
    assert (section.path, section.tag) == ("my dir/a b.txt", "1A2B")


def test_body_rows_are_literal():
    (hunk,) = only("[a.md#0000]\nPUT >4:\n+- second bullet\n++1 vote\n+\n+CUT 3.=4\n")
    assert isinstance(hunk, Hunk)
    assert hunk.body == ["- second bullet", "+1 vote", "", "CUT 3.=4"]
    assert any("inserted as text" in w for w in parse(
        "[a.md#0000]\nPUT >4:\n+CUT 3.=4\n").warnings)
    assert any("inserted as text" in w for w in parse(
        "[a.md#0000]\nPUT >4:\n+[b.py#12AB]\n").warnings)
    assert not parse("[a.json#0000]\nPUT >4:\n+[1, 2]\n").warnings


def test_blank_lines_inside_a_body_only_count_before_another_row():
    program = parse("[a#0000]\nPUT >1:\n+a\n\n+b\n\n\nPUT >2:\n+c\n\n")
    first, second = program.sections[0].hunks
    assert first.body == ["a", "", "b"] and second.body == ["c"]


def test_envelope_comments_multiple_sections_and_dropped_empty_headers():
    program = parse("\n*** Begin Patch\n[a#0000]\n# a comment\nCUT 1.=1\n[empty#0000]\n"
                    "[b#1111]\nREM\n*** End Patch\n[ignored#2222]\nREM\n")
    assert [s.path for s in program.sections] == ["a", "b"]


def test_register_spellings():
    (hunk,) = only("[a#0000]\nPUT >5@x_1-y\n")
    assert isinstance(hunk, Hunk) and hunk.register == "x_1-y"


def test_leniency_is_warned():
    program = parse("[a#0000]\nPUT 5:\n+x\nCUT 7..8\nCUT 9:\nPUT 10-11:\nPUT 12.=:\n+y\n")
    hunks = program.sections[0].hunks
    assert [h.locator for h in hunks] == [SpanLoc(5, 5), SpanLoc(7, 8), SpanLoc(9, 9),
                                          SpanLoc(10, 11), SpanLoc(12, 12)]
    assert hunks[3].body == []  # an empty span PUT deletes, with a warning
    assert len(program.warnings) >= 5


@pytest.mark.parametrize(("text", "code"), [
    ("", "empty_edit"),
    ("PUT 1.=1:\n+x\n", "missing_header"),
    ("@@ -1,2 +1,2 @@\n", "missing_header"),
    ("[a.py#12]\nREM\n", "malformed_header"),
    ("[a.py#12345]\nREM\n", "malformed_header"),
    ("[a.py#XYZW]\nREM\n", "malformed_header"),
    ("[a#b.py#1A2B]\nREM\n", "malformed_header"),
    ("[a.py#1A2B:42]\nREM\n", "malformed_header"),
    ("[a.py#1A2B] junk\nREM\n", "malformed_header"),
    ("[#1A2B]\nREM\n", "empty_path"),
    ("[a#0000]\n5\n", "missing_verb"),
    ("[a#0000]\n5 9\n", "missing_verb"),
    ("[a#0000]\n3.=4:\n+x\n", "missing_verb"),
    ("[a#0000]\nPUT 9.=5:\n+x\n", "invalid_range"),
    ("[a#0000]\nPUT 0.=5:\n+x\n", "invalid_line_number"),
    ("[a#0000]\nPUT 05.=6:\n+x\n", "invalid_line_number"),
    ("[a#0000]\nPUT 1.=100001:\n+x\n", "invalid_range"),
    ("[a#0000]\nPUT 99999999999999999.=99999999999999999:\n+x\n", "invalid_line_number"),
    ("[a#0000]\nPUT 5.=9*:\n+x\n", "invalid_locator"),
    ("[a#0000]\nPUT >5 @r:\n", "colon_on_register_put"),
    ("[a#0000]\nPUT >5 @r\n+x\n", "register_put_takes_no_body"),
    ("[a#0000]\nPUT >5\n+x\n", "colonless_put_takes_no_body"),
    ("[a#0000]\nPUT 3.=4\n", "colonless_span_put"),
    ("[a#0000]\nPUT 3*\n", "colonless_span_put"),
    ("[a#0000]\nPUT >3:\nCUT 1.=1\n", "empty_insert"),
    ("[a#0000]\nPUT >$:\n", "empty_insert"),
    ("[a#0000]\nCUT 1.=2\n+x\n", "cut_takes_no_body"),
    ("[a#0000]\n+x\n", "orphan_payload"),
    ("[a#0000]\nPUT 1.=1:\n+x\n-y\n", "minus_row_rejected"),
    ("[a#0000]\nREM\nCUT 1.=1\n", "rem_takes_no_body"),
    ("[a#0000]\nCUT 1.=1\nREM\n", "rem_takes_no_body"),
    ("[a#0000]\nREM\nMV b\n", "multiple_file_ops"),
    ("[a#0000]\nMV b\nMV c\n", "multiple_file_ops"),
    ("[a#0000]\nMV b\n+x\n", "move_takes_no_body"),
    ("[a#0000]\nREM\n+x\n", "move_takes_no_body"),
    ("[a#0000]\nMV\n", "missing_destination"),
    ("[a#0000]\n*** Update File: a\n", "diff_syntax"),
    ("[a#0000]\n@@ -1 +1 @@\n", "diff_syntax"),
    ("[a#0000]\n--- a/x\n", "diff_syntax"),
    ("[a#0000]\n3:text\n", "read_row_in_edit"),
    ("[a#0000]\nput 1.=1:\n+x\n", "unexpected_line"),
    ("[a#0000]\nMVP x\n", "unexpected_line"),
    ("[a#0000]\nPUT 1.=1:\n+x\nnot a row\n", "unexpected_line"),
    ("[a#0000]\nCUT 1.=1\n# late comment\nCUT 2.=2\n", "unexpected_line"),
    ("[a#0000]\nCUT <3\n", "invalid_locator"),
    ("[a#0000]\nPUT <$:\n+x\n", "invalid_locator"),
    ("[a#0000]\nPUT >5 @bad!name\n", "invalid_register"),
    ("[a#0000]\nPUT >5 @" + "r" * 65 + "\n", "invalid_register"),
    ("[a#0000]\nPUT 1.=1: +inline\n", "inline_body"),
    ("[a#0000]\nPUT :\n+x\n", "missing_locator"),
])
def test_malformed_programs_are_refused_with_a_code(text: str, code: str):
    with pytest.raises(HashlineError) as err:
        parse(text)
    assert err.value.code == code, str(err.value)
    assert err.value.domain == "caller"
