"""The config tree, presets, --steps_scaler and --config round trips."""

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from splat_train.configs import preset_names
from splat_train.trainer.cli import parse_args
from splat_train.trainer.config import (
    Config,
    Schedule,
    StepConfig,
    apply_overrides,
    dump_yaml,
    leaf_sections,
    load_yaml,
    nest,
    saved_setting,
    scale_schedule,
    to_dict,
)

STEP_LIKE = ("steps", "_iter", "_every", "interval")
NOT_STEPS = {"data.test_every"}  # counts images, not steps


def _fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp


def test_every_schedule_field_scales():
    """Scaling iterates the section's fields: any field added there is scaled too."""
    base = Schedule()
    half = scale_schedule(base, 0.5)
    for f in dataclasses.fields(Schedule):
        before, after = getattr(base, f.name), getattr(half, f.name)
        if isinstance(before, list):
            assert after == [int(v * 0.5) for v in before], f.name
        else:
            assert after == max(int(before * 0.5), 1 if before else 0), f.name


def _step_fields_outside_schedule(cls):
    return [
        name
        for name, tp in _fields(cls)
        if not name.startswith("schedule.")
        and any(tag in name.split(".")[-1] for tag in STEP_LIKE)
        and tp in (int, list[int])
        and name not in NOT_STEPS
    ]


def test_no_step_field_outside_schedule():
    """A step-valued field added anywhere but Schedule (the top level or any other section) would
    escape --steps_scaler."""
    sections = {name.split(".")[0] for name, _ in _fields(Config) if "." in name}
    assert sections == {"data", "model", "step", "schedule", "optim", "densify", "prune", "outputs", "distributed"}
    assert _step_fields_outside_schedule(Config) == []

    @dataclasses.dataclass
    class Step(StepConfig):
        warmup_steps: int = 100

    @dataclasses.dataclass
    class Tree(Config):
        step: Step = dataclasses.field(default_factory=Step)

    assert _step_fields_outside_schedule(Tree) == ["step.warmup_steps"]  # the check sees into sections


def test_steps_scaler_flag_scales_everything(tmp_path):
    cfg = parse_args(["default", "--steps_scaler", "0.25", "--result_dir", str(tmp_path)])
    ref = Schedule()
    assert cfg.schedule.max_steps == ref.max_steps // 4
    assert cfg.schedule.refine_stop_iter == ref.refine_stop_iter // 4
    assert cfg.schedule.eval_steps == [v // 4 for v in ref.eval_steps]
    assert cfg.steps_scaler == 1.0  # applied once: the saved config reruns the same schedule


def test_flags_spelled_as_gsplat(tmp_path):
    cfg = parse_args(
        [
            "default",
            "--data_factor",
            "2",
            "--max_steps",
            "123",
            "--batch_size",
            "3",
            "--packed",
            "--sh_degree",
            "2",
            "--test_every",
            "5",
            "--init_type",
            "random",
            "--eval_steps",
            "10",
            "20",
            "--result_dir",
            str(tmp_path),
        ]
    )
    assert (cfg.data.data_factor, cfg.schedule.max_steps, cfg.step.batch_size, cfg.step.packed) == (2, 123, 3, True)
    assert (cfg.model.sh_degree, cfg.data.test_every, cfg.model.init_type) == (2, 5, "random")
    assert cfg.schedule.eval_steps == [10, 20]


def test_presets_differ_and_load():
    assert {"default", "mcmc"} <= set(preset_names())
    mcmc = parse_args(["mcmc"])
    default = parse_args(["default"])
    assert mcmc.densify.strategy == "mcmc" and default.densify.strategy == "default"
    assert mcmc.step.opacity_reg > 0 and default.step.opacity_reg == 0


def test_config_file_round_trip(tmp_path):
    cfg = parse_args(["mcmc", "--max_steps", "77", "--steps_scaler", "0.5", "--result_dir", str(tmp_path)])
    path = tmp_path / "cfg.yml"
    path.write_text(dump_yaml(cfg))
    again = parse_args(["--config", str(path)])
    assert to_dict(again) == to_dict(cfg)
    override = parse_args(["--config", str(path), "--max_steps", "5"])
    assert override.schedule.max_steps == 5


FLAT_CFG = Path(__file__).resolve().parent / "data" / "cfg_flat.yml"
"""A cfg.yml as runs wrote it before the settings were grouped into sections: flat top-level keys
(``splat-train bytesplat --data_factor 2 --max_steps 200 --steps_scaler 0.5 --raster unfused
--result_dir /tmp/old_run --seed 7 --num_traj_frames 0 --lpips_net vgg --synthetic_layout city
--export_formats ply splat --resume``, resolved)."""


def test_a_flat_cfg_yml_of_before_the_sections_loads_into_them():
    flat = yaml.safe_load(FLAT_CFG.read_text())
    assert "raster" in flat and "step" not in flat  # the old layout
    cfg = parse_args(["--config", str(FLAT_CFG)])
    assert (cfg.data.data_factor, cfg.data.synthetic_layout, cfg.step.raster, cfg.step.sparse_grad_comm) == (
        2,
        "city",
        "unfused",
        True,
    )
    assert (cfg.schedule.max_steps, cfg.schedule.prune_stage2_step, cfg.seed) == (100, 7500, 7)
    assert (cfg.outputs.result_dir, cfg.outputs.num_traj_frames, cfg.outputs.lpips_net) == (
        Path("/tmp/old_run"),
        0,
        "vgg",
    )
    assert cfg.outputs.export_formats == ["ply", "splat"]
    assert not cfg.distributed.resume  # rerunning a saved config starts a new run (from_argv)
    assert load_yaml(FLAT_CFG).distributed.resume  # the file's own value, as --resume of that run reads it
    # the sectioned file the run writes now holds the same settings
    sectioned = yaml.safe_load(dump_yaml(load_yaml(FLAT_CFG)))
    assert "raster" not in sectioned and sectioned["step"]["raster"] == "unfused"
    assert {k for section in sectioned.values() if isinstance(section, dict) for k in section} | set(sectioned) >= set(
        flat
    )
    assert to_dict(apply_overrides(Config(), sectioned, "x")) == to_dict(load_yaml(FLAT_CFG))


def test_a_flat_key_goes_into_its_section_and_twice_is_refused():
    assert nest({"raster": "fused", "seed": 3, "step": {"packed": True}}, "x") == {
        "seed": 3,
        "step": {"packed": True, "raster": "fused"},
    }
    assert leaf_sections()["max_steps"] == ("schedule",) and leaf_sections()["steps_scaler"] == ()
    with pytest.raises(ValueError, match=r"f.yml: raster is given twice, at the top level and under step"):
        apply_overrides(Config(), {"raster": "fused", "step": {"raster": "unfused"}}, "f.yml")
    with pytest.raises(ValueError, match=r"f.yml: unknown setting\(s\) \['rastr'\]"):
        apply_overrides(Config(), {"rastr": "fused"}, "f.yml")


def test_a_checkpoints_config_is_read_flat_or_in_sections():
    """resume.py reads the step a checkpoint took from its config, written flat by older runs."""
    flat = yaml.safe_load(FLAT_CFG.read_text())
    assert saved_setting(flat, "raster") == "unfused"
    assert saved_setting(to_dict(Config()), "raster") == "auto" and to_dict(Config())["step"]["raster"] == "auto"
    assert saved_setting({}, "raster") is None


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["default", "--data_factor", "0"], "--data_factor"),
        (["default", "--sh_degree", "7"], "--sh_degree"),
        (["default", "--resume", "--overwrite"], "--resume"),
        (["nosuchpreset"], "preset"),
        (["default", "--config", "/nonexistent.yml"], "--config"),
        (["default", "--pipeline", "gsplat-dist", "--sparse_grad_comm"], "--sparse_grad_comm"),
        (["default", "--random_tile_shift", "--raster", "unfused"], "--random_tile_shift"),
        (["default", "--random_tile_shift", "--app_opt"], "--random_tile_shift needs the fused step.*--app_opt"),
        (["default", "--random_tile_shift", "--pipeline", "gsplat-dist"], "cannot run with --pipeline gsplat-dist"),
        # gsplat simple_trainer options refused, or in combinations that cannot work
        (["mcmc", "--strategy.absgrad"], "--absgrad"),
        (["default", "--absgrad", "--pipeline", "gsplat-dist"], "--absgrad"),
        (["default", "--depth_loss", "--raster", "fused"], "--depth_loss"),
        (["default", "--use_bilateral_grid", "--raster", "fused"], "--use_bilateral_grid"),
        (["default", "--tb_save_image", "--raster", "fused"], "--tb_save_image"),
        (["default", "--app_opt", "--raster", "fused"], "--app_opt"),
        (["default", "--pipeline", "gsplat-dist", "--raster", "fused"], "--raster fused needs --pipeline ours"),
        (["default", "--patch_size", "8"], "--patch_size"),
        (["default", "--pose_noise", "-1"], "--pose_noise"),
        (["default", "--bilateral_grid_shape", "4", "4"], "--bilateral_grid_shape"),
    ],
)
def test_bad_flags_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        parse_args(argv)


def test_gsplat_nested_spellings_are_aliases(tmp_path):
    """gsplat simple_trainer nests its strategy's fields (``--strategy.absgrad``) and calls
    --log_every --tb_every: both spellings set the same field."""
    cfg = parse_args(
        [
            "default",
            "--strategy.absgrad",
            "--strategy.grow_grad2d",
            "0.0008",
            "--strategy.prune_opa",
            "0.01",
            "--strategy.refine_every",
            "50",
            "--strategy.reset_every",
            "600",
            "--tb_every",
            "7",
        ]
    )
    assert cfg.densify.absgrad and cfg.densify.grow_grad2d == 0.0008 and cfg.densify.prune_opa == 0.01
    assert (cfg.schedule.refine_every, cfg.schedule.reset_every, cfg.schedule.log_every) == (50, 600, 7)
    mcmc = parse_args(["mcmc", "--strategy.cap_max", "5000", "--strategy.refine_stop_iter", "900"])
    assert (mcmc.densify.cap_max, mcmc.schedule.refine_stop_iter) == (5000, 900)
    assert parse_args(["default", "--absgrad"]).densify.absgrad


def test_cuda_graphs_in_a_config_file_reads_yaml_on_off_and_old_booleans(tmp_path):
    """YAML 1.1 reads a bare on / off as a boolean, and an earlier cfg.yml held a boolean
    cuda_graphs: both mean the setting of that name; the dumped config reads back as written."""
    path = tmp_path / "c.yml"
    for text, want in [("on", "on"), ("off", "off"), ("true", "on"), ("false", "off"), ("auto", "auto")]:
        path.write_text(f"cuda_graphs: {text}\n")
        assert load_yaml(path).step.cuda_graphs == want, text
        path.write_text(dump_yaml(load_yaml(path)))
        assert load_yaml(path).step.cuda_graphs == want, text
    path.write_text("cuda_graphs: sometimes\n")
    with pytest.raises(ValueError, match="cuda_graphs"):
        load_yaml(path)


def test_unknown_key_in_config_file(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("max_stepz: 3\n")
    with pytest.raises(ValueError, match="max_stepz"):
        load_yaml(path)


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["default", "--help"])
    text = capsys.readouterr().out
    for name, _ in _fields(Config):
        flag = "--" + name.split(".")[-1]
        assert flag in text, flag


def test_a_steps_scaler_that_leaves_no_step_is_refused_naming_it(tmp_path):
    """gsplat's int() would train 0 steps; one step in silence would hide the slip."""
    with pytest.raises(ValueError, match=r"--steps_scaler 0.01 makes --max_steps 30 zero steps.*at least 1/30"):
        parse_args(["default", "--max_steps", "30", "--steps_scaler", "0.01", "--result_dir", str(tmp_path)])
    cfg = parse_args(["default", "--max_steps", "30", "--steps_scaler", "0.04", "--result_dir", str(tmp_path)])
    assert cfg.schedule.max_steps == 1


# the last column: whether the native kernel is asked for (built) at all
@pytest.mark.parametrize(
    "flags, device, masked, ready, expected, asked",
    [
        ([], "cuda", False, True, "fused", True),  # the default on a GPU
        ([], "cpu", False, True, "unfused", False),  # ... and on the CPU
        ([], "cuda", False, False, "unfused", True),  # no native kernel: the unfused step
        ([], "cuda", True, True, "unfused", False),  # loss masks
        (["--app_opt"], "cuda", False, True, "unfused", False),
        (["--depth_loss"], "cuda", False, True, "unfused", False),
        (["--use_bilateral_grid"], "cuda", False, True, "unfused", False),
        (["--tb_save_image"], "cuda", False, True, "unfused", False),
        (["--pipeline", "gsplat-dist"], "cuda", False, True, "unfused", False),
        (["--random_tile_shift"], "cuda", False, True, "fused", True),
        (["--raster", "unfused"], "cuda", False, True, "unfused", False),
        (["--raster", "fused"], "cuda", False, True, "fused", True),
        (["--raster", "fused"], "cuda", False, False, "unfused", True),
        (["--raster", "fused"], "cpu", False, False, "fused", False),  # the PyTorch reference
        (["--ckpt", "ckpt_7_rank0.pt"], "cuda", False, True, "unfused", False),  # evaluation only
    ],
)
def test_raster_auto_is_fused_on_a_gpu_unless_the_run_needs_the_image(flags, device, masked, ready, expected, asked):
    from splat_train.trainer.step.plan import raster_mode

    cfg = parse_args(["default", *flags])
    assert cfg.step.raster == (flags[1] if flags[:1] == ["--raster"] else "auto")
    calls = []

    def kernel_ready():
        calls.append(1)
        return ready

    assert raster_mode(cfg, device, masked, kernel_ready)[0] == expected
    assert len(calls) == int(asked)


def test_raster_fused_refuses_loss_masks():
    from splat_train.trainer.step.plan import raster_mode

    with pytest.raises(ValueError, match="--raster fused cannot apply"):
        raster_mode(parse_args(["default", "--raster", "fused"]), "cuda", True, lambda: True)
