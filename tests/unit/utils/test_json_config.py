"""A received model folder's config.json, read by the tools users run: nested too deeply, not JSON,
not an object, or too large, it ends in one line naming the file, not in the parser's traceback."""

from __future__ import annotations

import pytest
from support.tiny_exports import write_tiny_export
from support.tools import load_tool

from implicit_megatron.utils.json_config import read_json_config
from implicit_megatron.utils.typed_yaml import MAX_CONFIG_BYTES


@pytest.mark.parametrize(("text", "why"), [("[" * 100_000 + "]" * 100_000, "nested too deeply to be a config"),
                                           ("{bad", "not JSON (Expecting property name"),
                                           ("[1, 2]", "not a JSON object"),
                                           ("\udcff", "not UTF-8 text (byte 0): not a JSON config, or damaged")])
def test_an_exports_config_that_is_not_a_config_is_one_line_naming_it(text, why, tmp_path, capsys):
    export = write_tiny_export("mamba2-explicit", tmp_path)
    (export / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert load_tool("generate").main([str(export), "--prompt", "ROMEO:", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"generate: {export / 'config.json'}: {why}") and err.count("\n") == 1, err


def test_a_deep_config_in_a_folder_to_import_is_one_line(tmp_path, capsys):
    (tmp_path / "received").mkdir()
    (tmp_path / "received" / "config.json").write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    assert load_tool("convert_checkpoint").main(["import", str(tmp_path / "received"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"convert_checkpoint: {tmp_path / 'received' / 'config.json'}: nested too "
                                       "deeply to be a config\n")


def test_a_config_larger_than_a_config_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "config.json"
    big.write_text("{\"pad\": \"" + "x" * MAX_CONFIG_BYTES + "\"}")
    said = rf"{big}: over {MAX_CONFIG_BYTES} bytes: a config is at most {MAX_CONFIG_BYTES}"
    with pytest.raises(ValueError, match=said):
        read_json_config(big)


def test_a_key_given_twice_in_one_object_is_refused_naming_it(tmp_path):
    twice = tmp_path / "config.json"
    twice.write_text('{"implicit_megatron": {"model": {"n_layers": 2, "n_layers": 3}}, "hidden_size": 64}')
    with pytest.raises(ValueError, match=rf"^{twice}: the key 'n_layers' is given twice in one object$"):
        read_json_config(twice)
