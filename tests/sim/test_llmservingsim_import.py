"""`python -m sim profile import-llmservingsim`: an LLMServingSim bundle becomes a version-5
profile whose tables are the bundle's rows combined as a step runs them, and every bad file is
refused naming the file, the line and the column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.model.presets import get_model_preset
from sim.cli.main import main
from sim.costmodel.llmservingsim_import import ProfileBundleError, llmservingsim_profile
from sim.costmodel.profile import load_profile
from tests.sim.llmservingsim_bundle import SEQUENCES, TOKENS, dense_us, write_bundle

TINY = get_model_preset("tiny-llama")
SHARED = Path(__file__).resolve().parents[3] / "shared" / "profiles" / "llmservingsim"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "bundle")


def test_tables_combine_the_layers_a_step_runs(bundle: Path) -> None:
    profile = llmservingsim_profile(bundle, 1, "cmd")
    ops = profile["ops"]
    assert profile["format_version"] == 5 and profile["model"] == "tiny-llama"
    assert profile["timer"] == "kernel_trace" and profile["extrapolation"] == "roofline"
    assert ops["linear"]["num_tokens"] == list(TOKENS)
    for i, t in enumerate(TOKENS):
        linear = sum(
            dense_us(layer, t) for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        )
        assert ops["linear"]["time_s"][i] == pytest.approx(linear * 1e-6)
        # Two RMSNorms a layer, rotary and the activation; the embedding and the final norm
        # run once a step, spread over the layers.
        per_layer = 2 * dense_us("layernorm", t) + dense_us("rotary_emb", t) + dense_us("act_fn", t)
        once = (dense_us("embedding", t) + dense_us("final_layernorm", t)) / TINY.num_layers
        assert ops["elementwise"]["time_s"][i] == pytest.approx((per_layer + once) * 1e-6)
    heads = [(50 + 2 * n + 10 + n) * 1e-6 for n in SEQUENCES]
    assert ops["lm_head"] == {"num_seqs": list(SEQUENCES), "time_s": pytest.approx(heads)}
    assert len(ops["attention"]["time_s"]) == len(ops["attention"]["n_decode"]) > 100
    skew = profile["decode_skew"]
    assert skew["alpha_default"] == 0.1
    assert skew["alpha_by_bucket"] == {"pc=0|n<=4|sr<=40%|kvB<=1k|kp=0": 0.5}


def test_cli_writes_a_profile_that_loads_and_runs(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert (
        main(["profile", "import-llmservingsim", str(bundle), "--tp", "1", "--out", str(out)]) == 0
    )
    profile = load_profile(out)
    assert profile.attention is not None and profile.decode_skew is not None
    assert "import-llmservingsim" in profile.command
    run = tmp_path / "run"
    argv = ["run", "traces/data/example.csv", "--model", "tiny-llama", "--profile", str(out)]
    assert main([*argv, "--out", str(run), "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["summary"]["completed"] > 0


def _rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        (
            "tp1/dense.csv",
            "qkv_proj,4,",
            "qkv_proj,four,",
            r"dense\.csv:\d+: column 2 \('tokens'\): expected an integer",
        ),
        (
            "tp1/dense.csv",
            "act_fn,2,",
            "act_fn,2,-",
            r"dense\.csv:\d+: column 3 \('time_us'\): expected a finite non-negative",
        ),
        (
            "tp1/dense.csv",
            "act_fn,2,",
            "mystery,2,",
            r"dense\.csv:\d+: column 1 \('layer'\): unknown layer 'mystery'",
        ),
        (
            "tp1/dense.csv",
            "act_fn,4,",
            "act_fn,2,",
            r"dense\.csv:\d+: layer 'act_fn' at 2 measured twice",
        ),
        (
            "tp1/dense.csv",
            "layer,tokens,time_us",
            "layer,num_tokens,time_us",
            r"dense\.csv:1: missing column\(s\) \['tokens'\]",
        ),
        ("tp1/per_sequence.csv", "sampler,2,", "sampler,2,x", r"per_sequence\.csv:\d+: column 3"),
        (
            "tp1/attention.csv",
            "0,0,1,16,",
            "0,5,1,16,",
            r"attention\.csv:2: .*a context needs a chunk",
        ),
        (
            "tp1/attention.csv",
            "0,0,1,16,",
            "0,0,1,16,7,",
            r"attention\.csv:2: 6 fields, the header has 5",
        ),
        (
            "tp1/skew_fit.csv",
            ",0.5,",
            ",half,",
            r"skew_fit\.csv:2: column 6 \('alpha'\): expected a number",
        ),
        (
            "meta.yaml",
            "tp_degrees: [1]",
            "tp_degrees: [1",
            r"meta\.yaml:\d+: column \d+: not valid YAML",
        ),
        (
            "meta.yaml",
            "num_attention_heads: 8",
            "num_attention_heads: 5",
            r"meta\.yaml: .*not tiny-llama's widths",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_file_line_and_column(
    bundle: Path, file: str, old: str, new: str, message: str
) -> None:
    _rewrite(bundle / file, old, new)
    with pytest.raises(ProfileBundleError, match=message):
        llmservingsim_profile(bundle, 1, "cmd")


def test_cli_error_names_the_file_without_a_traceback(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rewrite(bundle / "tp1/dense.csv", "qkv_proj,4,", "qkv_proj,4x,")
    out = str(tmp_path / "p.json")
    assert main(["profile", "import-llmservingsim", str(bundle), "--tp", "1", "--out", out]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "dense.csv:" in err and "column 2" in err
    assert "Traceback" not in err


def test_a_tp_the_bundle_lacks_is_refused(bundle: Path) -> None:
    with pytest.raises(ProfileBundleError, match=r"tp2: no such folder"):
        llmservingsim_profile(bundle, 2, "cmd")


def test_a_missing_meta_says_what_dir_is(tmp_path: Path) -> None:
    with pytest.raises(ProfileBundleError, match=r"meta\.yaml: cannot read.*meta\.yaml and tp<N>"):
        llmservingsim_profile(tmp_path, 1, "cmd")


@pytest.mark.shared
@pytest.mark.parametrize(
    ("folder", "tp"), [("meta-llama/Llama-3.1-8B/bf16", 1), ("Qwen/Qwen3-32B/bf16", 2)]
)
def test_the_shared_rtx_pro_6000_bundles_import(folder: str, tp: int, tmp_path: Path) -> None:
    root = SHARED / "RTXPRO6000" / folder
    if not root.is_dir():
        pytest.skip(f"{root} absent")
    out = tmp_path / "p.json"
    assert (
        main(["profile", "import-llmservingsim", str(root), "--tp", str(tp), "--out", str(out)])
        == 0
    )
    profile = load_profile(out)
    assert profile.tp == tp and profile.block_size == 16
    assert profile.device["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    # A decode-only row of attention.csv comes back as measured (us -> s).
    row = next(
        line.split(",")
        for line in (root / f"tp{tp}" / "attention.csv").read_text().splitlines()
        if line.startswith("0,0,64,1024,")
    )
    assert profile.attention is not None
    assert profile.attention(0, 0, 64, 1024) == pytest.approx(float(row[4]) * 1e-6)
