"""flash3.bench's host-side pieces (shapes, FLOPs, table, plot); no GPU needed."""

import pytest

from flash3 import bench


def test_training_shapes_follow_design():
    shapes = list(bench.training_shapes((64, 128, 256), bench.DEFAULT_SEQLENS, (False, True)))
    assert len(shapes) == 3 * 6 * 2
    for s in shapes:
        assert s["batch"] * s["seqlen"] == 16384
        assert s["heads"] * s["head_dim"] == 2048


def test_forward_flops():
    assert bench.forward_flops(2, 16, 1024, 1024, 128, False) == 4 * 2 * 16 * 1024 * 1024 * 128
    assert bench.forward_flops(2, 16, 1024, 1024, 128, True) == 2 * 2 * 16 * 1024 * 1024 * 128
    # Causal with sq != sk is not halved.
    assert bench.forward_flops(1, 1, 16, 1024, 64, True) == 4 * 16 * 1024 * 64
    # v's head dim apart: S costs 2 sq sk d, P V 2 sq sk dv.
    assert bench.forward_flops(1, 2, 64, 64, 192, False, 128) == 2 * 2 * 64 * 64 * (192 + 128)


def test_parse_args():
    args = bench.parse_args(["--quick", "--hdims", "128", "--causal", "yes"])
    assert args.hdims == (128,) and args.seqlens == bench.QUICK_SEQLENS and args.causal == "yes"
    assert bench.parse_args([]).seqlens == bench.DEFAULT_SEQLENS
    with pytest.raises(SystemExit):
        bench.parse_args(["--seqlens", "1000"])
    assert bench.parse_args(["--hdims", "96,192"]).hdims == (96, 192)  # 21 and 10 heads
    for bad in ("0", "4096"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--hdims", bad])
    assert bench.parse_args(["--backends", "flash3,cudnn"]).backends == ("flash3", "cudnn")
    for bad in ("flash3,cudnnn", "cudnn"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--backends", bad])
    args = bench.parse_args(["--window", "4096", "--hdims", "128"])
    assert args.window == 4096 and args.seqlens == (bench.WINDOW_SEQLEN,)
    with pytest.raises(SystemExit):
        bench.parse_args(["--window", "-1"])
    assert bench.parse_args(["--bwd", "--sinks"]).sinks
    for bad in (["--sinks", "--check"], ["--sinks", "--window", "64"], ["--sinks", "--overhead"],
                ["--varlen", "--window", "64"], ["--varlen", "--sinks"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.parse_args(["--varlen", "--bwd"]).hdims == (128,)
    assert bench.parse_args(["--hdims", "128,192x128"]).hdims == (128, (192, 128))
    for bad in (["--hdims", "192x0"], ["--hdims", "192x128", "--varlen"],
                ["--hdims", "192x128", "--window", "64"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    shapes = list(bench.training_shapes(((192, 128), 64), (8192,), (False,)))
    assert [(s["head_dim"], s["head_dim_v"], s["heads"]) for s in shapes] == [(192, 128, 10), (64, 64, 32)]
    assert [bench.hdim_label(s) for s in shapes] == ["192x128", "64"]


def test_varlen_lengths_are_the_issues_batch_and_reproducible():
    lengths = bench.varlen_lengths()
    assert len(lengths) == bench.VARLEN_BATCH == 64
    assert all(128 <= n <= 8192 for n in lengths) and lengths == bench.varlen_lengths()


def test_row_shows_na_and_ratio():
    shape = dict(head_dim=128, causal=True, seqlen=4096, batch=4, heads=16)
    row = bench._format_row(shape, {"flash3": 600.0, "cudnn": 500.0, "fa2": None}, None)
    assert "600.0" in row and "n/a" in row and "1.200x" in row
    row = bench._format_row(shape, {"flash3": None, "cudnn": 500.0, "fa2": 300.0},
                            {"ok": False, "max_abs_diff": 0.5, "against": "cudnn"})
    assert "CHECK FAILED" in row and row.count("n/a") == 2


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    results = [dict(head_dim=d, causal=c, seqlen=s, tflops={"flash3": 1.0 * s, "cudnn": 0.9 * s, "fa2": None})
               for d in (64, 128) for c in (False, True) for s in (512, 1024)]
    path = tmp_path / "bench.png"
    bench.plot(results, str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
