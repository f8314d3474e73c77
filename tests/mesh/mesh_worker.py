"""One process of a test mesh: joins as its JSON argument says, runs one action, prints one JSON line.

    python mesh_worker.py '{"index": 0, "count": 2, "directory": "...", "job": "j", "timeout": 20, "action": "gather"}'

Actions: "gather" (describe the mesh, all-gather each host domain's index, broadcast host domain 1's words,
on a GPU also gather device buffers with all_gather_device, then init a trainer over the mesh), "barrier" (a
barrier, after the others' "hang"), "hang" (print that it is ready and sleep: the test kills or stops it),
"trainer" (init a tiny trainer over the mesh with the given "seed" and "depth"), "train" (10 steps of
`items.trainer` over this process's shares, then every process saves to "checkpoint", which host domain 0
writes; answers the last step's losses; with "refuse_at", host domain 1 passes a bad item at that step first,
and the answer has each process's refusal). The last line is the action's answer or
{"code", "message"} of the UFormError it met, with "seconds" since the start or since the "ready" line printed
before it. "gpu": the GPU ordinal the process drives (Executor.for_vram(devices=[gpu])); without it the process
runs "devices" CPU devices.
"""

import json
import sys
import time

import numpy as np

import uform
from items import train, trainer

clock = [time.monotonic()]


def ready() -> None:
    print(json.dumps({"ready": True}), flush=True)
    clock[0] = time.monotonic()


def tiny_trainer(executor, mesh, spec: dict) -> uform.Trainer:
    return uform.Trainer.init_vram(executor, mesh=mesh, depth=spec.get("depth", 1), hidden=128,
                                   seed=spec.get("seed", 1), objective=uform.Objective.JOINT,
                                   schedule=uform.Schedule(steps=10),
                                   batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4,
                                                          max_columns_per_row=32))


def main(spec: dict) -> dict:
    executor = uform.Executor.for_vram(devices=[spec["gpu"]]) if "gpu" in spec else \
        uform.Executor.for_ram(device_count=spec.get("devices", 1))
    mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions(
        host_domain_index=spec["index"], host_domain_count=spec["count"], directory=spec["directory"],
        job=spec.get("job", "test"), timeout_seconds=spec["timeout"]))
    action = spec["action"]
    if action == "gather":
        gathered = mesh.collectives.all_gather(np.array([spec["index"]], np.int32))[:, 0].tolist()
        description = mesh.describe()
        said = mesh.collectives.broadcast_bytes(f"from {spec['index']}".encode() if spec["index"] == 1 else None, 1)
        found = {"gathered": gathered, "said": said.decode(), "world_size": description.world_size,
                 "first_rank": description.first_rank, "backend": description.backend, "attempt": description.attempt}
        if executor.is_gpu:
            device = executor.devices[0]
            send = device.put(np.full(3, spec["index"] + 0.5, np.float32))
            recv = device.empty((spec["count"], 3))
            mesh.collectives.all_gather_device(send, recv)
            found["device_gathered"] = recv.numpy().tolist()
        try:
            tiny_trainer(executor, mesh, spec)
        except uform.UFormError as error:
            return found | {"trainer": error.code.name, "message": error.message}
        return found | {"trainer": "made"}
    if action in ("barrier", "hang"):
        mesh.collectives.barrier()  # every process is connected now
        ready()
        if action == "hang":
            time.sleep(120)
        mesh.collectives.barrier()  # a peer is killed or stopped meanwhile
        return {"barrier": "passed"}
    if action == "trainer":
        tiny_trainer(executor, mesh, spec)
        return {"trainer": "made"}
    if action == "train":
        run = trainer(executor, mesh)
        refused = None
        if "refuse_at" in spec:  # steps before it, a step whose items host domain 1 refuses, then the rest
            train(run, spec["index"], spec["count"], range(spec["refuse_at"]))
            kind = uform.Modality.IMAGE if spec["index"] == 1 else uform.Modality.TEXT  # a run of text alone
            try:
                run.step([kind], [b"an item"])
            except uform.UFormError as error:
                refused = {"code": error.code.name, "message": error.message}
            stats = train(run, spec["index"], spec["count"], range(spec["refuse_at"], 10))
        else:
            stats = train(run, spec["index"], spec["count"], range(10))
        run.save(spec["checkpoint"])
        return {"loss": stats.loss, "masked": stats.masked_text_loss, "contrastive": stats.contrastive_loss,
                "refused": refused}
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    try:
        answer = main(json.loads(sys.argv[1]))
    except uform.UFormError as error:
        answer = {"code": error.code.name, "message": error.message}
    print(json.dumps(answer | {"seconds": time.monotonic() - clock[0]}), flush=True)
