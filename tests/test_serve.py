"""cdlm-serve (docs/guide/serving.md): requests read with cdlm-sample's rules, batches of mixed
requests whose seeded answers equal cdlm-sample's, and a live server on 127.0.0.1 driven by the
official ``openai`` client, raw server-sent events and a headless browser on its page."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("litserve")

from hydra import compose, initialize_config_dir  # noqa: E402

from cdlm import config_dir  # noqa: E402
from cdlm.cli.common import model_options  # noqa: E402
from cdlm.serve.api import CdlmAPI  # noqa: E402
from cdlm.serve.requests import read_ask  # noqa: E402
from cdlm.serve.spec import CompletionRequest  # noqa: E402
from cdlm.validation import UsageError  # noqa: E402
from tests.conftest import run_main  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m.content }} {% endfor %}"


def no_chat(_messages):
    raise AssertionError("not a chat")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "a", "step": 3}, "unknown field 'step'; valid: "),
        ({"prompt": "a", "steps": 0}, "steps must be"),
        ({"prompt": "a", "temperature": 0}, "temperature must be"),
        ({"prompt": "a", "sampler": "nope"}, "unknown sampler 'nope'; valid: "),
        ({"prompt": "a", "guidance_scale": -1}, "guidance_scale must be"),
        ({"prompt": "a", "stream": "yes"}, "stream must be true or false"),
        ({"prompt": "a", "stream_canvas": True}, "stream_canvas needs stream: true"),
        ({"prompt": "a", "n": 2}, "n must be 1"),
        ({"prompt": "a", "infill": "b [[2]]"}, "give exactly one of messages, prompt, infill"),
        ({}, "give exactly one of"),
        ({"infill": "a [[3]] b", "max_tokens": 4}, "an infill template sets its own length"),
        ({"prompt": 3}, "prompt must be a string"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(fields, message):
    with pytest.raises(UsageError, match=None) as caught:
        read_ask(fields, no_chat)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_request_without_a_seed_draws_one():
    seeds = {read_ask({"prompt": "a"}, no_chat).seed for _ in range(8)}
    assert len(seeds) > 1 and read_ask({"prompt": "a", "seed": 5}, no_chat).seed == 5


def world_api(process: str) -> CdlmAPI:
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("serve", ["ckpt=world:chars", f"process={process}"])
    api = CdlmAPI("world:chars", "cpu", model_options(cfg), gone={})
    api.setup("cpu")
    return api


def drawn(api: CdlmAPI, bodies: list[dict]) -> list[dict]:
    """Each request's answer when ``bodies`` are drawn as one batch: its text, or its error."""
    asks = [api.decode_request(CompletionRequest(**body)) for body in bodies]
    answers = [{"text": ""} for _ in bodies]
    for step in api.predict(asks):
        for answer, chunk in zip(answers, step, strict=True):
            if chunk.get("error"):
                answer["error"] = chunk["error"]
            answer["text"] += chunk.get("content", "")
            answer["done"] = answer.get("done") or chunk.get("done", False)
    return answers


def sampled(tmp_path: Path, process: str, body: dict) -> str:
    """What cdlm-sample draws for ``body`` alone: its prompts file of one line, same options."""
    row = {k: body[k] for k in ("prompt", "infill") if k in body}
    if "max_tokens" in body:
        row["max_new_tokens"] = body["max_tokens"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    args = [f"{k}={body[k]}" for k in ("steps", "seed") if k in body]
    if "sampler" in body:
        args.append(f"sampler={body['sampler']}")
    if "temperature" in body and process == "gaussian":  # the x0 softmax's
        args.append(f"temperature={body['temperature']}")
    elif "temperature" in body:  # the token draws': the default sampler's own option
        name = {"masked": "ancestral", "block": "block", "autoregressive": "ar"}[process]
        where = "temperature" if name == "ar" else "rule.temperature"
        args += [f"sampler={name}", f"sampler.{where}={body['temperature']}"]
    if body.get("guidance_scale", 1) != 1:
        args.append(f"guidance.scale={body['guidance_scale']}")
    out = tmp_path / "out.jsonl"
    result = run_main(
        "cdlm-sample",
        "ckpt=world:chars",
        f"process={process}",
        f"prompts={rows}",
        "num_samples=1",
        f"out={out}",
        *args,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text().splitlines()[0])["completion"]


@pytest.mark.parametrize("process", ["masked", "block", "gaussian", "autoregressive"])
def test_batched_answers_equal_cdlm_sample(process, tmp_path):
    """Requests of different prompts, lengths, seeds and steps, and a malformed one, drawn as
    one batch: each seeded answer is token for token cdlm-sample's of the request alone."""
    api = world_api(process)
    steps = 8 if process != "autoregressive" else None
    same = {"steps": steps} if steps else {}
    bodies = [
        {"prompt": "the ", "max_tokens": 12, "seed": 3, **same},
        {"prompt": "she was ", "max_tokens": 7, "seed": 11, **same},
        {"prompt": "a", "max_tokens": 5, "seed": 3, "stream": True, **same},
        {"prompt": "of ", "max_tokens": 9, "seed": 4, "temperature": 0.7},
        {"prompt": "x", "steps": 0},
    ]
    if process != "autoregressive":
        bodies.append({"infill": "the [[6]] and", "seed": 2, **same})
        bodies.append({"prompt": "in ", "max_tokens": 6, "seed": 5, "guidance_scale": 2, **same})
    answers = drawn(api, bodies)
    assert "steps must be" in answers[4]["error"]
    for body, answer in zip(bodies, answers, strict=True):
        if body is bodies[4]:
            continue
        assert answer["done"] and "error" not in answer
        assert answer["text"] == sampled(tmp_path, process, body), body


def test_streamed_text_is_the_answer_and_canvases_come_at_every_step():
    api = world_api("masked")
    body = {"prompt": "the ", "max_tokens": 10, "seed": 1, "steps": 5, "stream": True}
    ask = api.decode_request(CompletionRequest(**body, stream_canvas=True))
    chunks = [c for c in api.predict(ask)][1:]
    canvases = [c["canvas"] for c in chunks if "canvas" in c]
    assert [c["step"] for c in canvases] == list(range(5))
    assert all(len(c["pieces"]) == 14 and c["fixed"][:4] == [True] * 4 for c in canvases)
    text = "".join(c.get("content", "") for c in chunks)
    assert text == drawn(api, [body])[0]["text"]
    assert any(c.get("content") for c in chunks[:-1])  # committed text came before the end


def test_a_call_whose_clients_all_left_stops_at_the_next_step(capsys):
    api = world_api("masked")
    body = {"prompt": "the ", "max_tokens": 20, "seed": 1, "steps": 50, "stream": True}
    ask = api.decode_request(CompletionRequest(**body, stream_canvas=True, cdlm_request_id="r1"))
    chunks = []
    for chunk in api.predict(ask):
        chunks.append(chunk)
        if len(chunks) == 3:  # the accept chunk and two steps
            api.gone["r1"] = True
    assert len(chunks) <= 5 and not any(c.get("done") for c in chunks), len(chunks)
    stopped = re.search(
        r"stopped a sampler call of 1 requests at step (\d+) of 50", capsys.readouterr().err
    )
    assert stopped and int(stopped[1]) <= 4, stopped  # read two steps; one ahead, one more
    assert "r1" not in api.gone  # forgotten once its batch is over


# ----- a live server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``cdlm-serve`` of the masked chars world on a free port, with a chat template."""
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "server.log"
    command = [
        sys.executable,
        "-m",
        "cdlm.cli.serve",
        "ckpt=world:chars",
        "process=masked",
        f"port={port}",
        "max_batch_size=8",
        "batch_timeout=0.3",
        f"chat_template='{TEMPLATE}'",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=os.environ)
    import httpx

    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                raise AssertionError(log.read_text())
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"no server after 120 s:\n{log.read_text()}")
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="none", max_retries=0)


def test_the_openai_client_completes_and_streams(client):
    cdlm = {"seed": 7, "steps": 8}
    whole = client.completions.create(model="m", prompt="the ", max_tokens=16, extra_body=cdlm)
    text = whole.choices[0].text
    assert len(text) == 16 and whole.usage.completion_tokens == 16
    stream = client.completions.create(
        model="m", prompt="the ", max_tokens=16, stream=True, extra_body=cdlm
    )
    assert "".join(c.choices[0].text for c in stream) == text
    assert [m.id for m in client.models.list().data] == ["world:chars"]


def test_the_openai_client_chats(client):
    messages = [{"role": "user", "content": "the"}]
    cdlm = {"seed": 2, "steps": 8}
    chat = client.chat.completions.create(
        model="m", messages=messages, max_tokens=10, extra_body=cdlm
    )
    reply = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and len(reply) == 10
    stream = client.chat.completions.create(
        model="m", messages=messages, max_tokens=10, stream=True, extra_body=cdlm
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == reply


def test_a_bad_request_is_a_400_with_one_line(client, server):
    import httpx
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt="a", extra_body={"steps": 0})
    assert "steps must be" in str(caught.value)
    json_type = {"content-type": "application/json"}
    answer = httpx.post(f"{server[0]}/v1/completions", content=b"{no", headers=json_type)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("body: JSON decode error")
    answer = httpx.post(f"{server[0]}/v1/completions", json={"prompt": "a", "top_k": 3})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400 and message.startswith("unknown field 'top_k'; valid: ")


def test_concurrent_requests_are_batched_and_answer_as_alone(client, server):
    bodies = [
        dict(prompt=p, max_tokens=n, extra_body={"seed": s, "steps": 8})
        for p, n, s in [("the ", 12, 1), ("she ", 6, 2), ("a", 9, 3), ("of ", 14, 4)]
    ]
    alone = [client.completions.create(model="m", **b).choices[0].text for b in bodies]
    together: list[str | None] = [None] * len(bodies)

    def ask(k: int) -> None:
        together[k] = client.completions.create(model="m", **bodies[k]).choices[0].text

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    sizes = [line for line in server[1].read_text().splitlines() if "sampler calls" in line]
    assert any("batch of 1 " not in line for line in sizes), sizes


def test_stream_canvas_events_carry_the_canvas(server):
    import httpx

    body = {"prompt": "the ", "max_tokens": 8, "seed": 1, "steps": 4}
    body |= {"stream": True, "stream_canvas": True}
    with httpx.stream("POST", f"{server[0]}/v1/completions", json=body, timeout=60) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert [e["canvas"]["step"] for e in events if "canvas" in e] == [0, 1, 2, 3]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_client_that_leaves_mid_stream_stops_its_call(server, client):
    """The spec names a disconnected stream in ``gone``; the worker stops the call."""
    import httpx

    body = {"prompt": "the ", "max_tokens": 40, "seed": 1, "steps": 400, "stream": True}
    with httpx.stream("POST", f"{server[0]}/v1/completions", json=body, timeout=60) as answer:
        next(answer.iter_lines())  # the first event, then the client leaves
    after = client.completions.create(model="m", prompt="a", max_tokens=4, extra_body={"seed": 1})
    assert len(after.choices[0].text) == 4  # the others go on
    for _ in range(100):
        if "of 400: every client left" in server[1].read_text():
            return
        time.sleep(0.1)
    raise AssertionError(server[1].read_text()[-2000:])


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (apt install chromium)")
def test_the_page_draws_the_stream_in_a_browser(server, client, tmp_path):
    """A headless Chromium loads ``/`` with a request in its address, which the page sends and
    draws: its final text is the API's answer for the same request."""
    playwright = pytest.importorskip("playwright.sync_api")
    want = client.completions.create(
        model="m", prompt="she was ", max_tokens=24, extra_body={"seed": 5, "steps": 12}
    )
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{server[0]}/?prompt=she%20was%20&max_tokens=24&seed=5&steps=12&run=1")
        page.wait_for_selector("#text[data-done='1']", timeout=60_000)
        text, canvas = page.inner_text("#text"), page.inner_text("#canvas")
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        browser.close()
    assert text == want.choices[0].text and canvas.startswith("she was ")
    assert (tmp_path / "page.png").stat().st_size > 1000
