"""A run's start (``Trainer.init_vram``): its settings checked and, over a mesh, agreed by every process; its state
initialised from the seed or read from a checkpoint; a replica on every device of the executor.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import ErrorCode, UFormError
from ..executor import Executor, numeric_mode, run_numerics
from ..mesh import Mesh
from ..nn.resident import HostState
from . import checkpoint
from .config import validate_run
from .encoder import EncoderGeometry, EncoderModel, encoder_registry, initial_parameters
from .media_step import media_geometry
from .world import World, check_world, world_run


def start_run(executor: Executor, mesh: Mesh | None, resume, settings: dict, *, seed, progress, progress_steps: int,
              training: bool, numerics: str | None) -> tuple[World, object, list[EncoderModel], int]:
    """(world, run, replicas, step) of a run of these settings (``validate_run``'s keywords), started or resumed
    from `resume`; ``Trainer.init_vram`` says what each argument means. A refusal changes nothing: in a mesh every
    process learns of it (``Mesh.agree``) and raises it."""
    if not isinstance(executor, Executor):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"executor: expected uform.Executor, got "
                                                     f"{type(executor).__name__}")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"mesh: expected uform.Mesh, got {type(mesh).__name__}")
    try:
        if mesh is not None and mesh.executor is not executor:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, "mesh: it was made over another executor; pass the "
                                                         "executor the mesh was bootstrapped with")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"seed: must be an integer in [0, 2**64) (a u64), got {seed!r}")
        run = validate_run(**settings)
        requested = numerics
        numerics = None if numerics is None else run_numerics(numerics, executor)
    except UFormError as refusal:
        if mesh is not None:
            mesh.agree("Trainer.init_vram", refusal)
        raise
    if mesh is not None:
        mode = requested if requested is not None else "the checkpoint's" if resume is not None else numeric_mode()
        mesh.agree("Trainer.init_vram", {"run": json.loads(checkpoint.run_json(run)), "seed": int(seed),
                                         "numerics": mode, "resume": resume is not None,
                                         "training": bool(training)})
    world = World.of(executor, mesh)
    late = run.late_interaction
    geometry = EncoderGeometry(hidden=run.hidden, depth=run.depth, groups=run.contrastive.temperature_groups,
                               objective=run.objective, max_columns=run.batch.max_columns_per_row,
                               media=media_geometry(run.batch), late_width=late.width if late.weight > 0 else 0,
                               late_rows=(late.max_query_tokens_per_device, late.max_document_tokens_per_device))
    registry = encoder_registry(geometry)
    run_text = checkpoint.run_json(world_run(run, world.size))
    if resume is not None:
        loaded = checkpoint.read(resume, registry, run=run_text, seed=int(seed), progress=progress,
                                 progress_steps=progress_steps)
        if loaded is None:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, "resume: stopped by the progress callback")
        state, step, saved_numerics = loaded
        numerics = numerics or run_numerics(saved_numerics, executor)
    else:
        contrastive_run = run.contrastive
        state = HostState.starting(initial_parameters(geometry, int(seed), contrastive_run.inverse_temperature,
                                                      contrastive_run.bias, late.inverse_temperature, late.bias))
        step = 0
        numerics = numerics or run_numerics(None, executor)
    check_world(run, world, numerics, geometry.stack())
    widths = tuple(run.contrastive.matryoshka_dimensions) or (run.hidden,)
    replicas = [EncoderModel(device, geometry, state, widths, training=training, numerics=numerics)
                for device in executor.devices]
    return world, run, replicas, step
