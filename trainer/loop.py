"""The training loop: ``Trainer.train()`` and ``Trainer.train_step()``.

A step, in data-flow order: draw this rank's cameras -> render (projection, SH, exchange,
rasterization; render.py) -> loss -> backward (the exchange's reverse all_to_all brings every
partial gradient to its Gaussian's owner) -> Adam on the local shard -> densify the local shard.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from . import checkpoint, densify, evaluate, exchange, export, losses, prune
from .aux_modules import make_aux_modules, pose_perturbation
from .config import Config, dump_yaml, to_dict
from .data import CameraSampler, Dataset, Scene, split_indices
from .data.views import TrainViews
from .densify import initialize_state, make_strategy
from .depth import DepthTargets
from .launch import DistContext, Interrupted
from .model import (
    create_optimizers,
    create_shard,
    initial_points,
    keeps_morton_order,
    means_lr_scheduler,
    morton_order,
    optimizer_step,
)
from .profile_window import ProfileWindow
from .profiling import PhaseTimer, memory_model_line
from .render import (
    RenderSetup,
    check_camera_model,
    ops_for,
    resolve_backend,
    rigid_inverse,
    visible_gaussians,
)
from .report import Reporter
from .shard import GaussianShard
from .step import Batches, ForwardBackward, plan_step
from .step.plan import memory_tight
from .step.backward_adam import BackwardAdam
from .step.plan import (
    LAZY_MAX_SEEN_SHARE,
    LAZY_MIN_GAUSSIANS,
    check_pipeline,
    native_kernel_everywhere,
    seen_share_words,
    step_seen_share,
)
from .step.eager import unwrapped
from .viewer import start_training_viewer


STOP_CHECK_EVERY = 20  # W > 1: the most steps between the collectives that agree on a stop or a timed save


class Trainer:
    """One rank's view of a run. Every rank constructs one and calls the same methods."""

    def __init__(self, cfg: Config, ctx: DistContext, scene: Scene):
        self.cfg, self.ctx, self.device = cfg, ctx, ctx.device
        self.result_dir = Path(cfg.outputs.result_dir)
        self.report = Reporter(self.result_dir, ctx.rank)  # rank 0 writes; a no-op elsewhere
        self.backend = resolve_backend(cfg.step.backend, self.device)
        self.ops = ops_for(cfg.step.backend, self.device)
        self.scene = scene
        self.scene_scale = scene.scene_scale * 1.1 * cfg.model.global_scale
        check_camera_model(scene, cfg.data.camera_model)
        train_idx, test_idx = split_indices(len(scene.cameras), cfg.data.test_every)
        preload = cfg.data.image_cache_gb == 0  # with a bound, images are decoded as needed
        self.trainset = Dataset(scene, train_idx, preload=preload, alpha_as_mask=cfg.data.alpha_as_mask)
        mine = exchange.deal_views(len(test_idx), ctx)[0] if preload else ()  # the test views this rank scores
        self.testset = Dataset(scene, test_idx, preload=mine, alpha_as_mask=cfg.data.alpha_as_mask)
        # every rank's sampler: a rank knows what every other rank renders at a step without asking
        self.samplers = [CameraSampler(self.trainset, cfg.step.batch_size, cfg.seed, r) for r in range(ctx.world_size)]
        self.sampler = self.samplers[ctx.rank]
        check_pipeline(cfg, self.device.type, ctx.world_size, self.sampler, ctx.loopback)
        self.depth_targets = (
            DepthTargets(self.trainset, cfg.data.camera_model, self.device) if cfg.step.depth_loss else None
        )
        self.views = TrainViews(
            self.trainset,
            self.device,
            cfg.data.device_images_share,
            host_cache_bytes=int(cfg.data.image_cache_gb * 2**30),
            decode_threads=cfg.data.decode_threads,
            items_at=lambda step: self.sampler.batch_at(step),
            batch_size=cfg.step.batch_size,
        )
        if cfg.step.pose_noise > 0:  # gsplat's pose_perturb: a fixed random correction of every training camera
            self.views.camtoworlds = pose_perturbation(len(self.trainset), cfg.step.pose_noise, cfg.seed, self.device)(
                self.views.camtoworlds, self.views.ids
            ).detach()
        self.viewmats = rigid_inverse(self.views.camtoworlds)  # [V, 4, 4] world-to-camera, training views
        self.setup = RenderSetup(
            ctx,
            self.ops,
            cfg.model.sh_degree,
            cfg.step.packed,
            cfg.step.near_plane,
            cfg.step.far_plane,
            dict(camera_model=cfg.data.camera_model, antialiased=cfg.model.antialiased),
        )  # evaluation's and pruning's renders
        self.loss = losses.TrainingLoss(self.device, cfg.step.ssim_backend, cfg.step.ssim_lambda)
        torch.manual_seed(cfg.seed + ctx.rank)
        np.random.seed((cfg.seed + ctx.rank) % 2**32)
        points = initial_points(scene, cfg, self.scene_scale)
        params = create_shard(points, cfg, ctx.rank, ctx.world_size, self.device)
        optimizers = create_optimizers(params, cfg, ctx.world_size, self.scene_scale)
        scheduler = means_lr_scheduler(optimizers["means"], cfg.schedule.max_steps)
        strategy = make_strategy(cfg)
        prune.limit_densification(strategy, cfg)  # off from ByteSplat stage 2 on
        strategy.check_sanity(params, optimizers)
        self.shard = GaussianShard(
            params, optimizers, scheduler, strategy, initialize_state(strategy, self.scene_scale)
        )
        self.aux, self.aux_optimizers, self.aux_schedulers = make_aux_modules(cfg, len(self.trainset), ctx)
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else None
        num = int(params["means"].shape[0])
        self.plan = plan_step(
            cfg,
            self.device.type,
            ctx.world_size,
            masked=self.views.channels == 4,
            aux=tuple(self.aux),
            kernel_ready=lambda: native_kernel_everywhere(ctx, cfg.step.raster, self.report.warn),
            loopback=ctx.loopback,
            tight=memory_tight(num, free),
            num_gaussians=num,
            total_bytes=torch.cuda.get_device_properties(self.device).total_memory if free is not None else None,
            free_bytes=free,
            seen_share=self.seen_share(params["means"]) if self._lazy_auto_sized(num) else None,
        )
        self._say_plan()
        self.batches = Batches(
            ctx.rank,
            self.trainset,
            self.views,
            self.samplers,
            self.viewmats,
            cfg.seed,
            cfg.data.patch_size,
            cfg.step.random_bkgd,
            self.plan.tile_shift,
            poses=self.aux.get("pose"),
            with_layout=self.plan.pipeline == "ours",
            with_item_ids=bool(self.aux),
        )
        self.forward_backward = ForwardBackward(
            self.plan,
            cfg,
            RenderSetup(
                **{**vars(self.setup), "absgrad": cfg.densify.absgrad, "sparse_grad_comm": cfg.step.sparse_grad_comm}
            ),
            self.loss,
            self.aux,
            self.depth_targets,
            self.scene_scale,
            tb_wanted=lambda step: (
                cfg.outputs.tb_save_image and self.report.active and (step + 1) % cfg.schedule.log_every == 0
            ),
            warn=self.report.warn,
            backward_adam=BackwardAdam(self.device, self.plan.selective_adam) if self.plan.fused_adam else None,
        )
        if self.plan.lazy_sh_adam:
            self._defer_sh_adam()
        self.step = 0  # completed steps
        self._stats_step = 0  # step of the previous train stats file
        self.outputs_seconds = 0.0  # seconds of checkpoints, evaluations and outputs between steps (_steps)
        self.evaluation = evaluate.Evaluation(
            cfg, self.setup, scene, self.scene_scale, self.trainset, self.testset, self.report
        )
        self.last_stats: dict = {}
        self.timer = PhaseTimer(self.device, enabled=False)  # the benchmark and --profile enable it
        self.last_phases: dict = {}
        # the bench sets it for its timed steps: each keeps its RenderInfo in last_info (the bench
        # reads it and lets it go before the next step)
        self.record_info = False
        self.last_info: Optional[Any] = None
        self.last_export: Optional[dict] = None  # rank 0: the last exported model (export.export_merged)

    def _lazy_auto_sized(self, num: int) -> bool:
        """Whether --lazy_sh_adam auto asks how much of the shard a step sees: at its size."""
        return self.cfg.step.lazy_sh_adam == "auto" and num >= LAZY_MIN_GAUSSIANS

    def seen_share(self, means: torch.Tensor) -> float:
        """The share of the shard ``means`` (float [N, 3]) that a step of --batch_size cameras on
        each rank sees, estimated from the training cameras (step.plan.step_seen_share): what
        --lazy_sh_adam auto decides on."""
        sizes = torch.tensor([self.trainset.size(i) for i in range(len(self.trainset))], device=means.device)
        return step_seen_share(
            means,
            self.viewmats,
            self.views.Ks,
            sizes,
            self.cfg.step.near_plane,
            self.cfg.step.far_plane,
            self.cfg.step.batch_size,
            self.ctx.world_size,
        )

    def _defer_sh_adam(self) -> None:
        """The SH Adam of the Gaussians a step does not see waits from the next step on
        (--lazy_sh_adam; kernels/lazy_adam.py)."""
        # a loss term on the parameters themselves gives the unseen Gaussians gradients: their zeros are written
        regularized = self.cfg.step.opacity_reg > 0 or self.cfg.step.scale_reg > 0
        self.shard.defer_sh_adam(self.cfg.schedule.max_steps, unseen_zeros=regularized)
        self.forward_backward.defer_sh_adam(lambda: self.shard.lazy.rows(self.optimizers), self.shard.sync)

    def defer_sh_adam_if_large(self, step: int) -> bool:
        """--lazy_sh_adam auto where the shard started under plan.LAZY_MIN_GAUSSIANS, or a step saw
        more than plan.LAZY_MAX_SEEN_SHARE of it: once it holds that many and a step sees at most
        that share (densification; a resumed checkpoint: resume.resume_from and the bench's --ckpt
        call it after loading; checked after ``step`` steps), the SH Adam
        of unseen Gaussians is deferred from the next step on, and the console says so. Returns
        whether it started now. Each rank decides for its own shard (the deferral is local)."""
        n = self.shard.num
        if not self.plan.lazy_sh_adam_later or n < LAZY_MIN_GAUSSIANS:
            return False
        share = self.seen_share(self.shard.params["means"])
        if share > LAZY_MAX_SEEN_SHARE:
            return False  # a step sees too much of the shard: asked again at the next check
        why = f"--lazy_sh_adam auto: {n:,} Gaussians in the shard after step {step}, {seen_share_words(share)}"
        self.plan = dataclasses.replace(self.plan, lazy_sh_adam=True, lazy_sh_adam_why=why, lazy_sh_adam_later=False)
        self._defer_sh_adam()
        self.report.print(f"the SH Adam of unseen Gaussians deferred from here on ({why})")
        return True

    def _say_plan(self) -> None:
        """The plan's console line, and the warnings of flags it does not follow."""
        cfg, plan = self.cfg, self.plan
        if cfg.step.random_tile_shift and not plan.fused:
            self.report.warn(
                "warning: --random_tile_shift moves the fused step's tiles, and this run takes the unfused step "
                "(on the CPU only --raster fused runs it); the images are not shifted"
            )
        if cfg.step.cuda_graphs == "on" and plan.graphs == "off":
            self.report.warn(
                f"--cuda_graphs on: graphs do not apply to this run ({plan.graphs_why}); its steps run eagerly"
            )
        self.report.print(plan.describe())

    # ------------------------------------------------------------------ the shard's parts
    # (read and replaced by tests and the benchmark; the stages take self.shard)
    params = property(lambda self: self.shard.params, lambda self, v: setattr(self.shard, "params", v))
    optimizers = property(lambda self: self.shard.optimizers, lambda self, v: setattr(self.shard, "optimizers", v))
    scheduler = property(lambda self: self.shard.scheduler, lambda self, v: setattr(self.shard, "scheduler", v))
    strategy = property(lambda self: self.shard.strategy, lambda self, v: setattr(self.shard, "strategy", v))
    strategy_state = property(
        lambda self: self.shard.strategy_state, lambda self, v: setattr(self.shard, "strategy_state", v)
    )

    @property
    def raster(self) -> str:
        """The step's rasterization, "fused" or "unfused" (StepPlan.raster)."""
        return self.plan.raster

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return dict(
            **self.shard.state_dict(),  # params, optimizers, scheduler, strategy_state
            aux={k: unwrapped(m).state_dict() for k, m in self.aux.items()},  # the same keys at any W
            aux_optimizers={k: o.state_dict() for k, o in self.aux_optimizers.items()},
            aux_schedulers={k: o.state_dict() for k, o in self.aux_schedulers.items()},
            rng=checkpoint.rng_state(self.device),
            world_transform=torch.from_numpy(np.asarray(self.scene.transform, dtype=np.float64)),  # exports
            config=json.loads(json.dumps(to_dict(self.cfg))),
            raster=self.raster,  # the step this run took ("fused" / "unfused"), whatever --raster said
        )

    def load_state_dict(self, state: dict, restore_rng: bool = True) -> None:
        self.shard.load_state_dict(state, self.device)
        for k, module in self.aux.items():
            if k in state.get("aux", {}):  # checkpoints before the fix keep DDP's "module." prefix
                saved = {n.removeprefix("module."): v for n, v in state["aux"][k].items()}
                unwrapped(module).load_state_dict(saved)
                self.aux_optimizers[k].load_state_dict(state["aux_optimizers"][k])
                if k in self.aux_schedulers and k in state.get("aux_schedulers", {}):
                    self.aux_schedulers[k].load_state_dict(state["aux_schedulers"][k])
        self.step = self._stats_step = int(state["step"])
        self.shard_sizes_changed()
        if restore_rng and "rng" in state:
            checkpoint.set_rng_state(state["rng"], self.device)

    # ------------------------------------------------------------------ one step
    def sh_degree_at(self, step: int) -> int:
        return min(step // self.cfg.schedule.sh_degree_interval, self.cfg.model.sh_degree)

    def shard_sizes_changed(self) -> None:
        """Say that the shards may have changed size on some rank (densification, pruning, a
        loaded checkpoint): the next step gathers every rank's Gaussian count again. Every rank
        calls it at the same points of the run."""
        self.shard.sizes_changed()

    def shard_sizes(self) -> list[int]:
        """Every rank's Gaussian count, gathered after the last step that could change them (a
        host synchronization, only then; none in one process off the distributed path)."""
        n = int(self.params["means"].shape[0])
        if not self.ctx.distributed:
            self.shard.world_sizes = [n]
        elif self.shard.world_sizes is None:
            self.shard.world_sizes = exchange.gather_metadata(self.ctx, [n])[:, 0].tolist()
        return self.shard.world_sizes

    def train_step(self, step: int) -> dict:
        """Run training step ``step`` (0-based) on this rank; returns its scalars (device tensors;
        a step replayed as CUDA graphs returns its capture's buffers, which the next step
        overwrites: read them before it)."""
        cfg, timer = self.cfg, self.timer
        self.ctx.stats.phase = "forward"
        batch = self.batches.build(step, self.shard_sizes() if self.plan.pipeline == "ours" else [])
        backward_adam = self.forward_backward.backward_adam
        if backward_adam is not None:  # the step's constants for the Adam inside the projection's backward
            backward_adam.prepare(self.optimizers)
        lazy = self.shard.lazy  # --lazy_sh_adam: the SH rows of unseen Gaussians wait (kernels/lazy_adam.py)
        if lazy is not None:
            lazy.check_lrs(self.params, self.optimizers)
        out = self.forward_backward(batch, self.params, self.sh_degree_at(step), timer)
        info = out.info
        timer.begin("optimizer")
        # the Gaussians' Adams (one launch on a GPU, or already taken by the projection's backward);
        # --visible_adam / --sparse_grad: visible ones only; --lazy_sh_adam: the seen SH rows only
        if backward_adam is None or not backward_adam.commit(self.optimizers):
            # the rows the projection listed; None where every row was caught up for another projection
            seen = lazy.seen if lazy is not None and self.forward_backward.lazy_listed else None
            optimizer_step(self.optimizers, visible_gaussians(info) if self.plan.selective_adam else None, seen)
            if lazy is not None:
                lazy.stepped(self.optimizers, seen)
        for opt in self.aux_optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        for scheduler in self.aux_schedulers.values():
            scheduler.step()
        self.scheduler.step()
        timer.begin("densification")
        # where the strategy may grow, prune or relocate (by its own window: the bytesplat preset
        # stops its densification early)
        refines = densify.refines_at(self.shard.strategy, step)
        if refines:
            self.shard.sync()  # their surgery copies and cuts the SH rows and moments
        densify.post_backward(self.shard, cfg, step, info)
        if refines:
            self.shard.rows_changed()
            if keeps_morton_order(cfg):  # the new rows were appended
                self.shard.reorder(morton_order(self.params["means"]))
            self.defer_sh_adam_if_large(step + 1)
        self.last_phases = timer.end_step()
        self.last_info = info if self.record_info else None
        # tensors stay on the device: converting them here would synchronize every step
        return dict(
            loss=out.loss.detach(),
            l1=out.parts["l1"],
            ssim=out.parts["ssim"],
            num_gaussians=int(self.params["means"].shape[0]),
            num_isects=info.num_isects,
            **({"depth": out.parts["depth"].detach()} if "depth" in out.parts else {}),
        )

    # ------------------------------------------------------------------ the run
    def train(self) -> dict:
        """Train from ``self.step`` to ``max_steps``; evaluate, save and export on schedule."""
        cfg, s = self.cfg, self.cfg.schedule
        self.report.start_run(dump_yaml(cfg))  # the folder, cfg.yml, TensorBoard
        self.report.print(
            memory_model_line(
                self.backend,
                self.device,
                self.ctx.world_size,
                int(self.params["means"].shape[0]),
                self.cfg.model.sh_degree,
            )
        )
        bar = self.report.progress(range(self.step, s.max_steps), initial=self.step, total=s.max_steps)
        out: dict[str, Any] = {}
        written: list[Path] = []
        if self.step == 0 and 0 in s.eval_steps:
            self.evaluation.run(self.shard, 0)  # the initial model, before any step
        profiler = (
            ProfileWindow(
                self.result_dir,
                self.ctx.rank,
                self.device,
                s,
                cfg.outputs.profile_mode,
                self.timer,
                self.step,
                self.report.print,
                self.report.warn,
            )
            if cfg.outputs.profile
            else None
        )
        viewer = start_training_viewer(  # --no_disable_viewer: rank 0 of a one-process run
            cfg,
            self.report,
            lambda: (self.shard.activated(), self.sh_degree_at(self.step)),
            self.device,
            self.ops,
            self.result_dir,
            self.scene.cameras[self.trainset.indices[0]].camtoworld,
            self.scene.points,
        )
        first_step = self.step
        self._last_save = time.monotonic()
        try:
            with self.ctx.stop.deferred():  # SIGTERM: a checkpoint at the next step boundary, then the end
                out, written, loop_seconds = self._steps(bar, profiler, viewer)
        finally:  # also when a step raises: the viewer's lock and server, the image loader's threads
            if viewer is not None:
                viewer.stop()
            self.views.close()
            self.forward_backward.release()  # captured collectives go before the process group
        bar.close()
        if s.max_steps > first_step:
            steps = s.max_steps - first_step
            peak = (
                f", peak memory {torch.cuda.max_memory_allocated(self.device) / 2**30:.2f} GiB on rank 0"
                if self.device.type == "cuda"
                else ""
            )
            self.report.print(
                f"train loop: {steps} steps in {loop_seconds:.1f} s ({1000 * loop_seconds / steps:.2f} ms/step, "
                f"{self.raster} rasterization; evaluations, checkpoints and outputs excluded: "
                f"{self.outputs_seconds:.1f} s between steps), {out.get('num_gaussians', 0):,} Gaussians on rank 0{peak}"
            )
            graphs = self.forward_backward.graphs_summary()
            if graphs:
                self.report.print(graphs)
            streamed = self.views.stream_summary()  # None unless the images were streamed
            if streamed:
                self.report.print(streamed)
        if profiler is not None:
            profiler.stop()
        self.report.close()
        if s.max_steps > first_step:
            self.print_outputs(written)
        else:
            self.report.print(
                f"nothing to train: the run is at step {first_step} and --max_steps is {s.max_steps} "
                "(raise --max_steps to train on; --ckpt evaluates and exports a checkpoint)"
            )
        return out

    def _steps(self, bar, profiler, viewer=None) -> tuple[dict, list[Path], float]:
        """The step loop of :meth:`train`: (the last logged scalars, the files the last
        write_outputs wrote, seconds of training: the loop's wall time up to the last step less
        the checkpoints, evaluations and outputs written between steps). ``viewer``: the live
        viewer (viewer.py), told when a step begins and ends."""
        s = self.cfg.schedule
        window_start, window_steps = time.perf_counter(), 0
        loop_start, loop_seconds = time.perf_counter(), 0.0
        out, written = {}, []
        for step in bar:
            if profiler is not None:
                profiler.before_step(step)
            if viewer is not None:
                viewer.before_step()  # holds the viewer's lock: frames show the model between steps
            out = self.train_step(step)
            if profiler is not None:
                profiler.after_step(self.last_phases)
            self.step = done = step + 1
            window_steps += 1
            prune.run_stages(
                self.shard, self.setup, self.trainset, self.testset, self.cfg, self.report, done
            )  # ByteSplat pruning stages 2 and 3 at their steps (prune.py)
            if viewer is not None:
                viewer.after_step(done, sum(w * h for w, h in map(self.trainset.size, self.sampler.batch_at(step))))
            if done % s.log_every == 0 or done == s.max_steps:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                ms = (time.perf_counter() - window_start) * 1000.0 / window_steps
                window_start, window_steps = time.perf_counter(), 0
                out = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
                out["ms_per_step"] = ms
                self.last_stats = out
                bar.set_postfix(
                    {"loss": f"{out['loss']:.4f}", "gs": out["num_gaussians"], "it/s": f"{1000.0 / ms:.1f}"}
                )
                self.report.scalars(
                    {k: out[k] for k in ("loss", "l1", "ssim", "depth", "num_gaussians", "ms_per_step") if k in out},
                    done,
                    prefix="train/",
                )
                tb_image = self.forward_backward.take_tb_image()
                if tb_image is not None:  # --tb_save_image: ground truth | render, one row per image
                    self.report.image("train/render", tb_image.reshape(-1, *tb_image.shape[2:]).float().cpu(), done)
            if done == s.max_steps:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                loop_seconds = time.perf_counter() - loop_start - self.outputs_seconds  # before eval/export
            last = done == s.max_steps
            saved = done in s.save_steps or last
            writes_start = time.perf_counter()
            written = self.write_outputs(
                done, save=saved, ply=done in s.ply_steps or last, evaluation=done in s.eval_steps or last
            )
            self._answer_requests(done, saved)
            if not last:  # an evaluation or checkpoint between steps: not training time
                spent = time.perf_counter() - writes_start
                self.outputs_seconds += spent
                window_start += spent  # nor part of the logged ms/step
        return out, written, loop_seconds

    def _answer_requests(self, done: int, saved: bool) -> None:
        """At a step boundary: write a checkpoint when ``--save_every`` or ``--save_every_minutes``
        is due, and on a deferred SIGTERM or SIGINT write one and end the run
        (:class:`launch.Interrupted`). Every rank answers at the same step: with W > 1 the ranks
        combine their requests at the boundaries launch.StopRequest schedules (one small
        collective, read on the host, that also takes the slowest rank's seconds per step: at most
        STOP_CHECK_EVERY steps apart, fewer when steps are slow, down to every step, so that a
        request waits about launch.STOP_AGREE_BUDGET_S at most, or one step), at W = 1 every step."""
        every = self.cfg.schedule.save_every
        if every > 0 and done % every == 0 and not saved:  # --save_every: the same steps on every rank
            self.save_checkpoint()
            saved = True
        due = (
            self.cfg.distributed.save_every_minutes > 0
            and time.monotonic() - self._last_save >= 60 * self.cfg.distributed.save_every_minutes
        )
        request = self.ctx.stop
        signum = request.signum
        if saved:  # a scheduled checkpoint restarts the clock on every rank, also between agreements
            self._last_save = time.monotonic()
            due = False
        if self.ctx.distributed:
            if not request.check_due(done):
                return
            agreed = exchange.max_over_ranks(self.ctx, [signum, due, request.seconds_per_step(done)])
            signum, due = int(agreed[0]), agreed[1] > 0
            request.schedule(done, agreed[2], most=STOP_CHECK_EVERY)
        if (signum or due) and not saved:
            self.save_checkpoint()
            self._last_save = time.monotonic()
        if signum:
            self.report.stop_progress(done)  # the bar shows the checkpoint's step, not the one before
            self.report.close()
            raise Interrupted(request.signum or signum)

    def write_outputs(self, step: int, save: bool, ply: bool, evaluation: bool) -> list[Path]:
        """What a run writes after ``step`` steps, the model first: checkpoint, PLY, test metrics;
        then the optional outputs (test renders, --export_formats, trajectory video), whose
        failure is one warning line (evaluate.optional). Every rank calls this. Returns the files written (rank 0: all of
        them but the other ranks' checkpoints)."""
        written: list[Optional[Path]] = []
        if save:
            written.append(self.save_checkpoint())
        if ply and self.cfg.outputs.save_ply:
            self.last_export = export.export_merged(
                self.shard, self.ctx, self.cfg, self.scene.transform, self.result_dir, step
            )
            written.append(self.last_export["path"] if self.last_export else None)
        if evaluation:
            if self.evaluation.run(self.shard, step) is not None:
                written.append(self.result_dir / "stats" / f"val_step{step}.json")
                written.append(self.result_dir / "renders" / f"val_step{step}_*.png")
        if ply:  # Inria layout, web formats (rank 0 holds the export)
            made, self.last_export = self.last_export, None
            written += export.export_formats(
                made, self.cfg, self.result_dir, lambda: [self.scene.cameras[i] for i in self.trainset.indices]
            )
        if evaluation:
            written.append(self.evaluation.render_trajectory(self.shard, step))
        return [p for p in written if p is not None and any(p.parent.glob(p.name))]

    def print_outputs(self, written: list[Path]) -> None:
        """Rank 0: the last line of a run, ``outputs: ...``, naming the files of the final step (a
        checkpoint of every rank, the PLY, metrics, renders, video) and the TensorBoard folder."""
        self.report.outputs(written, self.ctx.world_size)

    def save_checkpoint(self) -> Path:
        path = checkpoint.save(
            self.result_dir / "ckpts", self.step, self.ctx.rank, self.ctx.world_size, self.state_dict()
        )
        self._write_train_stats()
        return path

    def _write_train_stats(self) -> None:
        """stats/train_step<step>_rank<r>.json; collectives and bytes are per step, averaged over
        the steps since the previous stats file (evaluation renders included)."""
        steps = max(self.step - self._stats_step, 1)
        self._stats_step = self.step
        comm = self.ctx.stats.reset()
        stats = dict(
            step=self.step,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            num_gaussians=int(self.params["means"].shape[0]),
            ms_per_step=self.last_stats.get("ms_per_step"),
            mem_peak_gib=(torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None),
            comm_per_step={k: {op: v / steps for op, v in d.items()} for k, d in comm.items()},
            raster=self.raster,  # the step taken: "fused" or "unfused"
            projection=self.plan.projection,  # "triton" or "gsplat"
        )
        path = self.result_dir / "stats" / f"train_step{self.step}_rank{self.ctx.rank}.json"
        checkpoint.atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(stats, indent=2)))
