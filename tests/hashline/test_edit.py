"""Reads and edits against a real workspace directory: every construct of HASHLINE.md, the
§10 worked examples, registers across calls, stale recovery, and BOM/line-ending round trips."""

from __future__ import annotations

import pytest

from kaizen_hashline import HashlineError
from tests.hashline.support import SETTINGS, Workspace


def lines(ws: Workspace, path: str) -> list[str]:
    return ws.text(path).split("\n")[:-1]


@pytest.mark.rule("R-154")
def test_read_view_is_omp_compatible_and_bounded(ws: Workspace):
    ws.write("big.txt", "".join(f"line {i}\n" for i in range(1, 1001)))
    first = ws.read("big.txt")
    rows = first.text.split("\n")
    assert rows[0] == f"[big.txt#{first.tag}]"
    assert rows[1] == "1:line 1" and rows[400] == "400:line 400"
    assert first.total_lines == 1000 and first.end == 400 and first.next_start == 401
    payload = first.to_payload()
    assert payload["truncated"] and payload["next_start"] == 401
    window = ws.read("big.txt", start=990, limit=50)
    assert window.end == 1000 and window.next_start is None and window.tag == first.tag
    # Only displayed lines count as seen; repeated reads of one text share one version.
    (version,) = ws.state.versions(ws.key, "big.txt")
    assert version.seen == set(range(1, 401)) | set(range(990, 1001))


def test_example_a_ranged_and_gap_put_use_original_numbers(app: Workspace):
    result = app.edit("[app/settings.py#BC00]\nPUT 3.=4:\n+TIMEOUT = 60\n+RETRIES = 5\n"
                      "+BACKOFF = 2\nPUT >1:\n+import json\n")
    assert lines(app, "app/settings.py") == [
        "import os", "import json", "", "TIMEOUT = 60", "RETRIES = 5", "BACKOFF = 2", "",
        "def load():", '    path = os.environ.get("CFG")', "    return path"]
    (section,) = result.sections
    assert (section.previous_tag, section.tag) == ("BC00", "DCB2")
    assert "+import json" in result.diff and "-TIMEOUT = 30" in result.diff
    assert result.to_payload()["sections"][0]["header"] == "[app/settings.py#DCB2]"


def test_example_b_block_put(app: Workspace):
    result = app.edit('[app/settings.py#BC00]\nPUT 6*:\n+def load(default=None):\n'
                      '+    return os.environ.get("CFG", default)\n')
    assert lines(app, "app/settings.py")[5:] == [
        "def load(default=None):", '    return os.environ.get("CFG", default)']
    assert result.sections[0].resolutions == ["PUT 6*: resolved lines 6-8 (3 lines)"]


def test_example_c_move_a_line_with_the_anonymous_register(app: Workspace):
    app.edit("[app/settings.py#BC00]\nCUT 4.=4\nPUT <3\n")
    assert lines(app, "app/settings.py")[:5] == [
        "import os", "", "RETRIES = 3", "TIMEOUT = 30", ""]


def test_example_d_named_register_moves_code_between_files_and_persists(app: Workspace):
    app.edit("[app/util.py#D831]\nCUT 3.=5 @dead\n[app/settings.py#BC00]\nPUT >$ @dead\n")
    assert lines(app, "app/util.py") == ["def helper(x):", "    return x * 2"]
    assert lines(app, "app/settings.py")[-3:] == ["", "def unused():", "    pass"]
    # @dead stays available to a later call: span paste over line 2 of util.py.
    tag = app.read("app/util.py").tag
    app.edit(f"[app/util.py#{tag}]\nPUT 2.=2 @dead\n")
    assert lines(app, "app/util.py") == ["def helper(x):", "", "def unused():", "    pass"]


def test_example_e_delete_edit_and_rename_in_one_call(app: Workspace):
    result = app.edit("[app/util.py#D831]\nREM\n[app/settings.py#BC00]\nPUT 3.=3:\n"
                      "+TIMEOUT = 45\nMV app/config.py\n")
    assert not (app.root / "app/util.py").exists()
    assert not (app.root / "app/settings.py").exists()
    assert lines(app, "app/config.py")[2] == "TIMEOUT = 45"
    deleted, moved = result.sections
    assert deleted.status == "deleted" and moved.moved_to == "app/config.py"
    assert "Deleted app/util.py" in result.summary() and "Moved to app/config.py" in \
        result.summary()
    # The snapshot history moved with the file: the old tag still works at the new path.
    app.edit("[app/config.py#BC00]\nPUT 4.=4:\n+RETRIES = 1\n")
    assert lines(app, "app/config.py")[3] == "RETRIES = 1"
    assert app.state.versions(app.key, "app/util.py") == []


def test_example_f_literal_leading_minus_and_plus(ws: Workspace):
    ws.write("NOTES.md", "# Notes\n\n- first bullet\n\n")
    tag = ws.read("NOTES.md").tag
    ws.edit(f"[NOTES.md#{tag}]\nPUT >3:\n+- second bullet\n++1 vote\n")
    assert ws.text("NOTES.md") == "# Notes\n\n- first bullet\n- second bullet\n+1 vote\n\n"


@pytest.mark.rule("R-158")
def test_example_g_stale_snapshot_is_remapped_onto_one_region(app: Workspace):
    app.write("app/settings.py", SETTINGS.replace("import os\n", "import os\nimport sys\n"))
    result = app.edit("[app/settings.py#BC00]\nPUT 4.=4:\n+RETRIES = 9\n")
    assert lines(app, "app/settings.py")[4] == "RETRIES = 9"
    assert any("remapping anchors (+1" in w for w in result.sections[0].warnings)


@pytest.mark.rule("R-158")
def test_example_h_anchors_on_both_sides_of_an_insert_are_refused(app: Workspace):
    changed = SETTINGS.replace("RETRIES = 3\n", "RETRIES = 3\nEXTRA = 1\n")
    app.write("app/settings.py", changed)
    with pytest.raises(HashlineError) as err:
        app.edit("[app/settings.py#BC00]\nPUT 3.=3:\n+A = 1\nPUT 7.=7:\n+B = 2\n")
    assert err.value.code == "ambiguous_anchor"
    assert app.text("app/settings.py") == changed
    # The error names the live tag and records it, so it is usable next.
    live = app.read("app/settings.py").tag
    assert f"[app/settings.py#{live}]" in str(err.value)


@pytest.mark.rule("R-158")
def test_example_h_changed_anchor_is_refused(app: Workspace):
    changed = SETTINGS.replace("RETRIES = 3", "RETRIES = 4")
    app.write("app/settings.py", changed)
    with pytest.raises(HashlineError) as err:
        app.edit("[app/settings.py#BC00]\nPUT 4.=4:\n+RETRIES = 9\n")
    assert err.value.code == "stale_tag" and "changed since the read" in str(err.value)
    assert "*4:RETRIES = 4" in str(err.value)  # context rows, anchor starred
    assert len(str(err.value)) <= 500
    assert app.text("app/settings.py") == changed


@pytest.mark.rule("R-086", "R-158")
def test_example_i_unseen_anchor_is_revealed_then_accepted(ws: Workspace):
    ws.write("app/settings.py", SETTINGS)
    assert ws.read("app/settings.py", start=1, limit=4).tag == "BC00"
    program = "[app/settings.py#BC00]\nPUT 7.=7:\n+    path = 'x'\n"
    with pytest.raises(HashlineError) as err:
        ws.edit(program)
    assert err.value.code == "unseen_anchor"
    assert '7:    path = os.environ.get("CFG")' in str(err.value)
    assert len(str(err.value)) <= 500  # the pipeline shows at most 500 characters
    assert ws.text("app/settings.py") == SETTINGS
    ws.edit(program)  # the identical retry succeeds: the reveal showed line 7 in full
    assert lines(ws, "app/settings.py")[6] == "    path = 'x'"


def test_unseen_reveal_too_long_requires_a_read(ws: Workspace):
    ws.write("a.txt", "".join(f"{'x' * 200} {i}\n" for i in range(1, 20)))
    tag = ws.read("a.txt", limit=1).tag
    for _ in range(2):
        with pytest.raises(HashlineError) as err:
            ws.edit(f"[a.txt#{tag}]\nPUT 10.=10:\n+y\n")
        assert err.value.code == "unseen_anchor" and "start=10" in str(err.value)


def test_gap_ordering_at_one_original_position(ws: Workspace):
    ws.write("o.txt", "1\n2\n3\n4\n")
    tag = ws.read("o.txt").tag
    ws.edit(f"[o.txt#{tag}]\nPUT >$:\n+tail\nPUT <1:\n+head\nPUT >2:\n+after2\n"
            "PUT <3:\n+before3\nPUT 2.=3:\n+R\nPUT >3:\n+after3a\nPUT >3:\n+after3b\n")
    assert lines(ws, "o.txt") == ["head", "1", "R", "after2", "before3", "after3a",
                                  "after3b", "4", "tail"]


def test_tail_keeps_the_terminal_newline_state(ws: Workspace):
    ws.write("n.txt", "a\nb")
    tag = ws.read("n.txt").tag
    ws.edit(f"[n.txt#{tag}]\nPUT >$:\n+c\n")
    assert ws.text("n.txt") == "a\nb\nc"


def test_range_reaching_the_sentinel_stops_at_the_last_line(ws: Workspace):
    ws.write("s.txt", "a\nb\n")
    tag = ws.read("s.txt").tag
    ws.edit(f"[s.txt#{tag}]\nPUT 2.=3:\n+B\n")
    assert ws.text("s.txt") == "a\nB\n"


def test_empty_file_accepts_head_and_tail(ws: Workspace):
    ws.write("e.txt", "")
    tag = ws.read("e.txt").tag
    assert tag == "5D05"
    ws.edit(f"[e.txt#{tag}]\nPUT <1:\n+first\nPUT >$:\n+last\n")
    assert ws.text("e.txt") == "first\nlast\n"


def test_span_paste_cut_block_and_after_block(ws: Workspace):
    ws.write("m.py", "import os\n\n\ndef a():\n    return 1\n\n\ndef b():\n    return 2\n")
    tag = ws.read("m.py").tag
    result = ws.edit(f"[m.py#{tag}]\nCUT 4* @fa\nPUT >8* @fa\nPUT >8*:\n+\n+# end\n")
    assert ws.text("m.py") == ("import os\n\n\n\n\ndef b():\n    return 2\n"
                               "def a():\n    return 1\n\n# end\n")
    assert any("lands after line 9" in r for r in result.sections[0].resolutions)
    tag = ws.read("m.py").tag
    ws.edit(f"[m.py#{tag}]\nPUT 6* @fa\n")
    assert "def b" not in ws.text("m.py") and ws.text("m.py").count("def a") == 2


def test_after_block_falls_back_to_plain_gap_when_unresolvable(ws: Workspace):
    ws.write("x.txt", "a\nb\n")
    tag = ws.read("x.txt").tag
    result = ws.edit(f"[x.txt#{tag}]\nPUT >1*:\n+c\n")
    assert ws.text("x.txt") == "a\nc\nb\n"
    assert any("treated as >1" in w for w in result.sections[0].warnings)


def test_markdown_and_brace_blocks(ws: Workspace):
    ws.write("d.md", "# T\n\n## A\ntext\n\n## B\nb\n")
    tag = ws.read("d.md").tag
    ws.edit(f"[d.md#{tag}]\nPUT 3*:\n+## A2\n+new\n")
    assert ws.text("d.md") == "# T\n\n## A2\nnew\n\n## B\nb\n"
    ws.write("f.js", "function f() {\n  if (x) {\n    y();\n  }\n}\nconst z = 1;\n")
    tag = ws.read("f.js").tag
    ws.edit(f"[f.js#{tag}]\nCUT 2*\n")
    assert ws.text("f.js") == "function f() {\n}\nconst z = 1;\n"


@pytest.mark.parametrize(("program", "code"), [
    ("PUT 1*:\n+x\n", "block_single_line"),
    ("PUT 2*:\n+x\n", "block_unresolved"),      # blank line
    ("PUT 5*:\n+x\n", "block_single_line"),     # `    return 1`
    ("PUT >1*:\n+x\n", "block_single_line"),    # >N* still fails on a one-line node
])
def test_block_refusals(ws: Workspace, program: str, code: str):
    ws.write("m.py", "import os\n\ndef a():\n    x = 1\n    return 1\n")
    tag = ws.read("m.py").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[m.py#{tag}]\n{program}")
    assert err.value.code == code


def test_block_on_unknown_language_is_refused(ws: Workspace):
    ws.write("x.txt", "a\nb\n")
    tag = ws.read("x.txt").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[x.txt#{tag}]\nCUT 1*\n")
    assert err.value.code == "block_resolver_unavailable"


def test_exact_same_range_later_put_wins_with_a_warning(ws: Workspace):
    ws.write("w.txt", "a\nb\nc\n")
    tag = ws.read("w.txt").tag
    result = ws.edit(f"[w.txt#{tag}]\nPUT 2.=2:\n+first\nPUT 2.=2:\n+second\n")
    assert ws.text("w.txt") == "a\nsecond\nc\n"
    assert any("replaced by the later" in w for w in result.sections[0].warnings)


def test_same_path_sections_merge(ws: Workspace):
    ws.write("a.txt", "1\n2\n3\n")
    ws.write("b.txt", "x\n")
    ta, tb = ws.read("a.txt").tag, ws.read("b.txt").tag
    ws.edit(f"[a.txt#{ta}]\nPUT 1.=1:\n+one\n[b.txt#{tb}]\nPUT >1:\n+y\n"
            f"[a.txt#{ta}]\nPUT 3.=3:\n+three\n")
    assert ws.text("a.txt") == "one\n2\nthree\n" and ws.text("b.txt") == "x\ny\n"


def test_registers_flow_in_authored_order(ws: Workspace):
    ws.write("a.txt", "1\n2\n3\n")
    tag = ws.read("a.txt").tag
    result = ws.edit(f"[a.txt#{tag}]\nPUT >3 @r\nCUT 1.=1 @r\nPUT >2 @r\n")
    # The paste above the CUT saw an empty register: a no-op with a warning.
    assert ws.text("a.txt") == "2\n1\n3\n"
    assert any("@r is empty" in w for w in result.sections[0].warnings)


def test_anonymous_paste_can_repeat_and_is_per_call(ws: Workspace):
    ws.write("a.txt", "1\n2\n3\n")
    tag = ws.read("a.txt").tag
    ws.edit(f"[a.txt#{tag}]\nCUT 1.=1\nPUT >2\nPUT >3\n")
    assert ws.text("a.txt") == "2\n1\n3\n1\n"
    tag = ws.read("a.txt").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[a.txt#{tag}]\nPUT >1\n")
    assert err.value.code == "empty_paste"


@pytest.mark.parametrize(("program", "code"), [
    ("CUT 1.=1\nCUT 2.=2\nPUT >3\n", "ambiguous_paste"),
    ("PUT 1.=1 @nothing\n", "empty_register"),
    ("PUT 1.=2:\n+x\nCUT 2.=3\n", "overlapping_hunks"),
    ("CUT 2.=2\nPUT 2.=2:\n+x\n", "overlapping_hunks"),
    ("PUT 4.=4:\n+x\n", "out_of_range"),
    ("PUT >9:\n+x\n", "out_of_range"),
    ("CUT 2.=7\n", "out_of_range"),
    ("PUT 2.=2:\n+2\n", "no_op"),
])
def test_apply_refusals(ws: Workspace, program: str, code: str):
    ws.write("a.txt", "1\n2\n3\n")
    tag = ws.read("a.txt").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[a.txt#{tag}]\n{program}")
    assert err.value.code == code, str(err.value)
    assert ws.text("a.txt") == "1\n2\n3\n"


def test_interleaved_register_sections_are_refused(ws: Workspace):
    ws.write("a.txt", "1\n2\n")
    ws.write("b.txt", "x\n")
    ta, tb = ws.read("a.txt").tag, ws.read("b.txt").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[a.txt#{ta}]\nCUT 1.=1 @r\n[b.txt#{tb}]\nPUT >1 @r\n[a.txt#{ta}]\n"
                "PUT >2 @r\n")
    assert err.value.code == "clipboard_interleaved_sections"


def test_header_errors_after_parsing(ws: Workspace):
    ws.write("a.txt", "1\n")
    tag = ws.read("a.txt").tag
    cases = {
        "[a.txt]\nPUT >$:\n+x\n": "missing_tag",
        f"[a.txt#{tag}]\nPUT >$:\n+x\n[a.txt#0000]\nPUT <1:\n+y\n": "conflicting_tags",
        f"[a.txt#{tag}]\nPUT >$:\n+x\n[./a.txt#{tag}]\nPUT <1:\n+y\n": "duplicate_path",
        f"[a.txt#{tag}]\nMV ./a.txt\n": "move_to_same_path",
        f"[a.txt#{tag}]\nREM\n[a.txt#{tag}]\nPUT <1:\n+y\n": "rem_takes_no_body",
    }
    for program, code in cases.items():
        with pytest.raises(HashlineError) as err:
            ws.edit(program)
        assert err.value.code == code, program
    assert ws.text("a.txt") == "1\n"


def test_multi_section_no_op_is_refused(ws: Workspace):
    ws.write("a.txt", "1\n")
    ws.write("b.txt", "2\n")
    ta, tb = ws.read("a.txt").tag, ws.read("b.txt").tag
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[a.txt#{ta}]\nPUT 1.=1:\n+one\n[b.txt#{tb}]\nPUT 1.=1:\n+2\n")
    assert err.value.code == "no_op" and ws.text("a.txt") == "1\n"


def test_path_recovery_by_file_name_and_tag(ws: Workspace):
    ws.write("src/util.py", "x = 1\n")
    tag = ws.read("src/util.py").tag
    result = ws.edit(f"[util.py#{tag}]\nPUT 1.=1:\n+x = 2\n")
    assert ws.text("src/util.py") == "x = 2\n"
    assert any("editing that file" in w for w in result.sections[0].warnings)


@pytest.mark.rule("R-086")
def test_ambiguous_path_recovery_is_refused(ws: Workspace):
    ws.write("a/util.py", "x = 1\n")
    ws.write("b/util.py", "x = 1\n")
    tag = ws.read("a/util.py").tag
    ws.read("b/util.py")
    with pytest.raises(HashlineError) as err:
        ws.edit(f"[util.py#{tag}]\nPUT 1.=1:\n+x = 2\n")
    assert err.value.code == "ambiguous_recovery"
    assert ws.text("a/util.py") == ws.text("b/util.py") == "x = 1\n"


def test_stale_head_insert_applies_to_the_live_file(app: Workspace):
    app.write("app/settings.py", "# changed\n" + SETTINGS)
    result = app.edit("[app/settings.py#BC00]\nPUT <1:\n+# header\n")
    assert app.text("app/settings.py").startswith("# header\n# changed\nimport os\n")
    assert any("stale" in w for w in result.sections[0].warnings)


def test_old_tag_after_own_edit_recovers_from_an_earlier_snapshot(app: Workspace):
    app.edit("[app/settings.py#BC00]\nPUT 8.=8:\n+    return path or ''\n")
    result = app.edit("[app/settings.py#BC00]\nPUT 3.=3:\n+TIMEOUT = 1\n")
    assert lines(app, "app/settings.py")[2] == "TIMEOUT = 1"
    assert lines(app, "app/settings.py")[7] == "    return path or ''"
    assert "recovered from an earlier in-session snapshot" in result.sections[0].warnings


def test_stale_rem_is_refused(app: Workspace):
    app.write("app/util.py", "changed\n")
    with pytest.raises(HashlineError) as err:
        app.edit("[app/util.py#D831]\nREM\n")
    assert err.value.code == "stale_tag" and app.text("app/util.py") == "changed\n"


@pytest.mark.rule("R-154")
def test_bom_and_crlf_round_trip(ws: Workspace):
    raw = "\ufeffa\r\nb\r\nc\r\n".encode()
    ws.write("w.txt", raw)
    view = ws.read("w.txt")
    assert view.text == f"[w.txt#{view.tag}]\n1:a\n2:b\n3:c"
    assert view.bom and view.eol == "crlf" and view.tag == ws.read("w.txt").tag
    (version,) = ws.state.versions(ws.key, "w.txt")
    assert version.text == "a\nb\nc\n"  # normalized in trusted state
    ws.edit(f"[w.txt#{view.tag}]\nPUT 2.=2:\n+B\n")
    assert (ws.root / "w.txt").read_bytes() == "\ufeffa\r\nB\r\nc\r\n".encode()


def test_lone_cr_round_trip(ws: Workspace):
    ws.write("m.txt", b"a\rb\r")
    tag = ws.read("m.txt").tag
    ws.edit(f"[m.txt#{tag}]\nPUT >$:\n+c\n")
    assert (ws.root / "m.txt").read_bytes() == b"a\rb\rc\r"


@pytest.mark.rule("R-157")
def test_edit_result_diff_is_bounded(ws: Workspace):
    ws.write("big.txt", "".join(f"{i}\n" for i in range(1, 3001)))
    tag = ws.read("big.txt").tag
    for start in (401, 801, 1201, 1601, 2001, 2401, 2801):
        ws.read("big.txt", start=start)
    result = ws.edit(f"[big.txt#{tag}]\nCUT 1.=3000\nPUT >$:\n+only\n")
    assert result.diff_truncated and len(result.diff.split("\n")) <= 402
    assert ws.text("big.txt") == "only\n"


def test_seen_lines_follow_an_edit(ws: Workspace):
    ws.write("a.txt", "".join(f"{i}\n" for i in range(1, 11)))
    tag = ws.read("a.txt", limit=3).tag
    ws.edit(f"[a.txt#{tag}]\nPUT <1:\n+zero\n")
    new_tag = ws.read("a.txt", limit=1).tag  # reading line 1 only adds line 1
    (version, *_rest) = ws.state.versions(ws.key, "a.txt")
    assert version.tag == new_tag and version.seen == {1, 2, 3, 4}
