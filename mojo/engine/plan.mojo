"""Plans: a model's kernel launches recorded once and replayed with no Python per launch.

Every kernel's Python entry point ends in one `Launcher`: the function that runs the kernel's tasks
[0, n) with its operands on a device (`launch_index[body]`, `launch_rows[body]`, the GEMM's
`launch_product[...]`, ...). While a device records (`plan_begin`), an entry point appends
(launcher, n, operands) to the recording instead of running it (`record_or_launch`); `plan_end`
keeps the recording as one of the device's plans, and `plan_run` replays it:

- on the CPU, and on a GPU when asked, as a loop that calls the same launchers with the same
  operands in the same order (so the same bits as the calls it recorded);
- on a GPU by default, as a `DeviceGraph`: the loop above is run once against the graph builder's
  recording context (the device's context is swapped for it), so every launch becomes a node in
  stream order, and each replay submits the whole graph at once.

A plan holds addresses, so it reads whatever those buffers hold when it runs: per-step values
(ids, targets, AdamW's bias corrections) live in buffers the caller writes before each replay.
Copies between host and device are never recorded: while a device records, they raise.

The one import circle of the engine runs through here, and is the types' own: a `Device` holds its plans, a
plan's ops hold `Launcher`s (`engine.launch`), and a launcher takes a pointer to the `Device`.
"""

from std.collections import Optional
from max.gpu.host import DeviceGraph, DeviceGraphBuilder
from engine.launch import Args, DevicePtr, Launcher
from engine.target import HAS_ACCELERATOR


@fieldwise_init
struct PlanOp(ImplicitlyCopyable, Movable):
    """One recorded launch: the kernel's launcher, its task count and its operands."""

    var launch: Launcher
    var n: Int
    var args: Args


struct Plan(Movable):
    """Recorded launches, and on a GPU the device graph made of them (None: replayed as a loop)."""

    var ops: List[PlanOp]
    var graph: Optional[DeviceGraph]

    def __init__(out self):
        self.ops = List[PlanOp]()
        self.graph = None


def record_or_launch[launch: Launcher](dev: DevicePtr, n: Int, args: Args) raises:
    """Run the launch, or append it to the device's recording if one is open."""
    if dev[].recording:
        dev[].recording.value().ops.append(PlanOp(launch, n, args))
        return
    launch(dev, n, args)


def plan_begin(dev: DevicePtr) raises:
    if dev[].recording:
        raise Error("a plan is already being recorded on ", dev[])
    dev[].recording = Plan()


def plan_end(dev: DevicePtr, graph: Bool) raises -> Int:
    """Close the recording and keep it as a plan; answers its id. graph (a GPU only): replay it as a device
    graph, else as a loop of launches."""
    if not dev[].recording:
        raise Error("no plan is being recorded on ", dev[])
    var plan = dev[].recording.take()
    if graph and dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            plan.graph = graph_of(dev, plan.ops)
    for id in range(len(dev[].plans)):  # a freed plan's slot is reused
        if not dev[].plans[id]:
            dev[].plans[id] = plan^
            return id
    dev[].plans.append(plan^)
    return len(dev[].plans) - 1


def graph_of(dev: DevicePtr, ops: List[PlanOp]) raises -> DeviceGraph:
    """The device graph of `ops`: each launcher run once with the device's context swapped for the graph
    builder's recording context, so its launches become the graph's nodes, in order."""
    var context = dev[].context.value()

    def build(mut builder: DeviceGraphBuilder) raises {var dev, imm ops}:
        var saved = dev[].context.value()
        dev[].context = builder.recording_context()
        try:
            for op in ops:
                op.launch(dev, op.n, op.args)
        finally:
            dev[].context = saved

    return DeviceGraph.create(context, build)


def plan_run(dev: DevicePtr, id: Int) raises:
    """Replay plan `id`: its device graph, or its launches in order."""
    if dev[].recording:
        raise Error("cannot run a plan while one is being recorded on ", dev[])
    if id < 0 or id >= len(dev[].plans) or not dev[].plans[id]:
        raise Error("plan ", id, " does not exist on ", dev[])
    if dev[].plans[id].value().graph:
        dev[].plans[id].value().graph.value().replay()
        return
    for i in range(len(dev[].plans[id].value().ops)):
        var op = dev[].plans[id].value().ops[i]
        op.launch(dev, op.n, op.args)


def plan_free(dev: DevicePtr, id: Int) raises:
    if id >= 0 and id < len(dev[].plans):
        dev[].plans[id] = None
