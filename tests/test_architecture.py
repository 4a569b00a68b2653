"""The package's structure, read from its source (scripts/import_graph.py): which modules may talk
to other ranks, and that no two modules depend on each other (imports inside functions and under
TYPE_CHECKING count)."""

from splat_train.scripts import import_graph


def test_only_exchange_and_launch_import_torch_distributed():
    _, external = import_graph.graph()
    assert import_graph.distributed_importers(external) == sorted(import_graph.DISTRIBUTED_HOMES)


def test_no_dependency_cycle():
    edges, _ = import_graph.graph()
    assert import_graph.cycles(edges) == []


def test_scripts_use_the_library_not_the_cli():
    """scripts/ build configs with config.from_argv and scenes with data.scene_from_config."""
    edges, _ = import_graph.graph()
    users = {m for m, targets in edges.items() if m.startswith("scripts.") and "trainer.cli" in targets}
    assert users == set()


def test_library_config_and_scene_from_argv():
    import pytest

    from splat_train.trainer.config import from_argv
    from splat_train.trainer.data import scene_from_config

    with pytest.raises(ValueError, match="name a preset"):
        from_argv([])
    cfg = from_argv(["default", "--max_steps", "3", "--synthetic_num_cameras", "4"])
    assert cfg.schedule.max_steps == 3
    assert len(scene_from_config(cfg).cameras) == 4


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path):
    for pkg in import_graph.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "trainer" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (tmp_path / "trainer" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "trainer" / "c.py").write_text(
        "def g():\n    import splat_train.trainer.a\n    import torch.distributed as dist\n"
    )
    edges, external = import_graph.graph(tmp_path)
    assert edges["trainer.a"] == {"trainer.b"} and edges["trainer.b"] == {"trainer.c"}
    assert edges["trainer.c"] == {"trainer.a"}
    assert import_graph.cycles(edges) == [["trainer.a", "trainer.b", "trainer.c"]]
    assert import_graph.distributed_importers(external) == ["trainer.c"]


def test_dist_context_is_frozen():
    """What a pass does differently (--sparse_grad_comm) is an argument of the pass, not a field
    set on the context for a backward to read."""
    import dataclasses

    import pytest

    from splat_train.trainer.launch import DistContext

    ctx = DistContext()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.rank = 1  # type: ignore[misc]
    assert not hasattr(ctx, "sparse_grad_comm")
