"""samples/ are real outputs of the toolkit, valid against the shipped JSON Schemas."""

from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest
from referencing import Registry, Resource

from dphil import schemas
from tests.support.commands import BIN, ROOT

SCHEMA_DIR = ROOT / "schemas"


def registry() -> Registry:
    resources = []
    for path in SCHEMA_DIR.glob("*.schema.json"):
        doc = json.loads(path.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


def validator(name: str):
    schema = json.loads((SCHEMA_DIR / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry())


def sample_records(pattern: str):
    for path in sorted((ROOT / "samples").glob(pattern)):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            yield f"{path.name}:{lineno}", json.loads(line)


def test_schemas_ship_with_the_package():
    from importlib.resources import files

    shipped = {p.name for p in files(schemas).iterdir() if p.name.endswith(".schema.json")}
    assert {"episode.schema.json", "scored-episode.schema.json"} <= shipped


def test_episode_samples_validate():
    v = validator("episode.schema.json")
    seen = 0
    for where, rec in sample_records("*.jsonl"):
        errors = list(v.iter_errors(rec))
        assert not errors, f"{where}: {errors[0].message}"
        seen += 1
    assert seen >= 21


def test_scored_samples_validate_and_unscored_do_not():
    v = validator("scored-episode.schema.json")
    for where, rec in sample_records("*.s*ed.jsonl"):
        assert not list(v.iter_errors(rec)), where
    _, plain = next(sample_records("naive.jsonl"))
    assert list(v.iter_errors(plain))  # an unscored episode lacks reward and metrics


@pytest.mark.parametrize(
    "broken",
    [
        {"turns": [{"round": 0, "philosopher": 0, "action": "eat", "ok": True, "reason": None}]},
        {"protocol": "chess"},
        {"meals": [-1, 0, 0, 0, 0]},
        {"episode_id": "not-hex"},
    ],
)
def test_schema_rejects_broken_records(broken):
    _, rec = next(sample_records("hierarchy.jsonl"))
    rec.update(broken)
    assert list(validator("episode.schema.json").iter_errors(rec))


def test_samples_are_reproducible(tmp_path):
    work = tmp_path / "samples"
    work.mkdir()
    script = (ROOT / "samples" / "make_samples.sh").read_text()
    (work / "make_samples.sh").write_text(script)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["bash", str(work / "make_samples.sh")], check=True, capture_output=True, env=env)
    for fresh in work.glob("*.jsonl"):
        committed = ROOT / "samples" / fresh.name
        assert committed.read_text() == fresh.read_text(), f"samples/{fresh.name} is stale: run samples/make_samples.sh"
