"""Reading a document safely (arachne/errors.py): nesting, duplicate keys, numbers, values, one-line messages."""

from __future__ import annotations

import time

import pytest

from arachne.errors import MAX_DEPTH, InputError, load_document, load_yaml, parse_document


def refused(text: str, as_json: bool = False) -> str:
    with pytest.raises(InputError) as info:
        parse_document(text, "doc", as_json=as_json)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("doc: "), msg
    return msg


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 900, 5000, 100_000])
@pytest.mark.parametrize("as_json", [True, False])
def test_deep_nesting_is_refused_not_a_recursion_error(depth, as_json):
    msg = refused('{"a": ' + "[" * depth + "]" * depth + "}", as_json)
    assert "nested more than" in msg or "nesting depth" in msg, msg


def test_nesting_up_to_the_limit_is_read():
    depth = MAX_DEPTH - 1  # the top-level mapping is one level
    assert parse_document('{"a": ' + "[" * depth + "]" * depth + "}", "doc", as_json=True)


@pytest.mark.parametrize("text,as_json,field", [
    ('{"nodes": [{"name": "a", "gpus_per_node": 4, "gpus_per_node": 2}]}', True, "nodes[0].gpus_per_node"),
    ("nodes:\n  - name: a\n    gpus_per_node: 4\n    gpus_per_node: 2\n", False, "nodes[0].gpus_per_node"),
    ('{"a": 1, "a": 1}', True, "a"),
    ("a: {x: 1, y: {z: 1, z: 2}}\n", False, "a.y.z"),
    ("<<: {x: 1, x: 2}\ny: 1\n", False, "x"),  # an inline mapping under a merge key
])
def test_duplicate_keys_are_refused_naming_the_key(text, as_json, field):
    msg = refused(text, as_json)
    assert f"doc: {field}: duplicate key" in msg, msg


def test_yaml_duplicate_names_the_line_of_the_second_key():
    assert "line 4" in refused("nodes:\n  - name: a\n    gpus_per_node: 4\n    gpus_per_node: 2\n")


def test_yaml_merge_keys_may_still_override():
    doc = parse_document("base: &b {gpu: A100-40, gpus_per_node: 4}\nnode:\n  <<: *b\n  gpus_per_node: 2\n")
    assert doc["node"] == {"gpu": "A100-40", "gpus_per_node": 2}


def test_load_yaml_refuses_duplicates_too():
    import yaml

    with pytest.raises(yaml.YAMLError):
        load_yaml("a: 1\na: 2\n")


@pytest.mark.parametrize("text,as_json,needle", [
    ('{"a": [1, {"b": NaN}]}', True, "a[1].b: nan is not a finite number"),
    ('{"a": Infinity}', True, "a: inf is not a finite number"),
    ('{"a": 1e999}', True, "a: inf is not a finite number"),
    ("a: [1, {b: .inf}]\n", False, "a[1].b: inf is not a finite number"),
    ("a: .NaN\n", False, "a: nan is not a finite number"),
    ('{"a": ' + "9" * 5000 + "}", True, "too many digits"),
    ("a: " + "9" * 5000 + "\n", False, "too many digits"),
])
def test_non_finite_and_overlong_numbers_are_refused(text, as_json, needle):
    assert needle in refused(text, as_json)


@pytest.mark.parametrize("text,needle", [
    ("a: 2024-01-01\n", "a: unsupported value of type date"),
    ("a: !!binary aGVsbG8=\n", "a: unsupported value of type bytes"),
    ("a: !!set {x}\n", "a: unsupported value of type set"),
    ("{1: x}\n", "1: keys must be strings"),
    ("a: &x [*x]\n", "a[0]: a YAML alias refers to"),
])
def test_yaml_values_beyond_json_are_refused(text, needle):
    assert needle in refused(text)


def test_a_lone_surrogate_is_refused():
    assert "a: invalid text" in refused('{"a": "\\ud800"}', as_json=True)


def test_alias_bombs_are_refused_quickly():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 values
    t0 = time.perf_counter()
    assert "too large" in refused("\n".join(lines) + "\n")
    assert time.perf_counter() - t0 < 2


def test_messages_stay_on_one_line():
    err = InputError("a\nb.yaml", "nodes[0].name", "unknown GPU type 'x\x1b[31m\u2028\ud800'")
    assert str(err) == "a\\nb.yaml: nodes[0].name: unknown GPU type 'x\\x1b[31m\\u2028\\ud800'"
    assert err.source == "a\nb.yaml"  # the parts keep what was given


def test_load_document_refuses_what_is_not_a_text_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="cannot read file"):
        load_document(bad)
    with pytest.raises(InputError, match="is a directory"):
        load_document(tmp_path)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert load_document(bom) == {"a": 1}
