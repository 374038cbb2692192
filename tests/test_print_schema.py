"""``builder print`` is :mod:`builder.images.printed`'s model, and docs/print.schema.json is that model's
JSON Schema: the file and the model change together (``make schema`` writes the file), the command's
output holds to the file, and bench (which imports nothing of builder) rejects output that does not.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers import run_builder

from bench.project import PRINT_SCHEMA, printed
from builder.images import printed as model
from devtools.support import REPO


def test_the_committed_schema_is_the_models():
    committed = json.loads(PRINT_SCHEMA.read_text())
    assert committed == model.schema(), (
        f"{PRINT_SCHEMA.relative_to(REPO)} differs from builder/images/printed.py's model: run `make schema` "
        "(builder print --schema > docs/print.schema.json) and commit both")


def test_print_holds_to_the_schema_and_print_schema_writes_it(project):
    out = json.loads(run_builder("print", cwd=project).stdout)
    jsonschema.Draft202012Validator(json.loads(PRINT_SCHEMA.read_text())).validate(out)
    assert [t["name"] for t in out["targets"]][:2] == ["cpu", "nvidia-cu130"]
    cpu = out["targets"][0]
    assert list(cpu)[-4:] == ["compression", "locks", "content_tags", "plan"]
    assert cpu["plan"]["linux/amd64"]["content_tag"] == cpu["content_tags"]["linux/amd64"]
    assert json.loads(run_builder("print", "--schema", cwd=project).stdout) == model.schema()


def test_bench_rejects_output_the_schema_does_not_describe(project):
    out = json.loads(run_builder("print", "-t", "cpu", cwd=project).stdout)
    assert printed(json.dumps(out)) == out
    out["targets"][0]["plan"]["linux/amd64"]["stages"] = "build"
    with pytest.raises(SystemExit, match="at targets/0/plan/linux/amd64/stages: 'build' is not of type 'array'"):
        printed(json.dumps(out))
    del out["targets"][0]["plan"]
    out["targets"][0]["plans"] = {}
    with pytest.raises(SystemExit, match="at targets/0: "):
        printed(json.dumps(out))
