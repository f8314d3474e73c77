"""What the training commands (``python -m uform train``, ``python -m uform.lm``) share: flags, the run
directory, metrics, the loss plot, checkpoint rotation and a clean stop on SIGINT or SIGTERM.

A run directory holds::

    config.toml             every setting of the run, resolved (``--config`` reads it back)
    metrics.csv             one row per step: losses, learning rate, throughput, held-out metrics
    loss.png                the loss curves and the held-out metric, redrawn at each save and evaluation
    checkpoints/step-NNNNNNN.<ext>   every --save-every steps, the last --keep of them kept
    model.<ext>             the final checkpoint (a hard link to the last step's)

``--resume RUN_DIR`` reads the config back, loads the newest checkpoint, drops the metrics rows past
it, and goes on; a run whose data order is a pure function of (seed, step) then ends with the same
bits as a run never stopped.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import fcntl
import io
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import tomli_w

from .executor import Executor, default_executor, devices_executor, executor_from
from .files import write_atomically

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package (pyproject.toml asks for it there)
    import tomli as tomllib

CHECKPOINTS = "checkpoints"
CONFIG = "config.toml"
METRICS = "metrics.csv"
PLOT = "loss.png"
SUMMARY = "summary.json"
LOCK = ".lock"
_HELD_LOCKS: dict[Path, object] = {}  # each run directory's lock file, open (so held) until the process ends


class UsageError(Exception):
    """A setting refused before anything runs; the message is one line naming the flag and what to change."""


# ---- flags ---------------------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and ends each flag's help with its default, unless the help says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the flag: no usage block, no traceback. Flags are
    spelled whole (no abbreviations), so that the flags a command line gives can be told apart."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=HelpFormatter, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


for _check in (positive_int, non_negative_int, positive_float, non_negative_float, fraction):
    _check.__name__ = _check.__name__.replace("_", " ")  # argparse names the type in its message


RUN_FLAGS = ("config", "resume", "run_dir")
"""Flags that say where a run is, not what it trains: never part of its config."""


def settings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settings by destination: every flag but help and RUN_FLAGS."""
    return {action.dest: action for action in parser._actions
            if action.option_strings and action.dest not in ("help", *RUN_FLAGS)}


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Destinations of the flags written on the command line."""
    given = set()
    for token in argv:
        action = parser._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("--") else None
        if action is not None:
            given.add(action.dest)
    return given


def read_config(parser: argparse.ArgumentParser, path: Path, flag: str) -> dict:
    """A TOML config's settings, named as the flags (``pairs-per-step`` or ``pairs_per_step``), each checked
    and converted as its flag would be."""
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except OSError as error:
        raise UsageError(f"{flag}: cannot read {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{flag}: {path} is not TOML: {error}") from None
    except UnicodeDecodeError as error:  # tomllib reads UTF-8 text; a binary file fails before parsing
        raise UsageError(f"{flag}: {path} is not TOML: not UTF-8 text (byte {error.start})") from None
    actions = settings(parser)
    values = {}
    for key, value in table.items():
        dest = key.replace("-", "_")
        if dest not in actions:
            raise UsageError(f"{flag}: {path}: unknown setting {key!r} (the settings are the flags of "
                             f"{parser.prog} --help)")
        action = actions[dest]
        if action.type is None and not isinstance(value, str):
            raise UsageError(f"{flag}: {path}: {key} = {value!r}: a string is expected (quote it)")
        try:
            value = action.type(str(value)) if action.type is not None else value
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise UsageError(f"{flag}: {path}: {key} = {value!r}: {error}") from None
        if action.choices is not None and value not in action.choices:
            raise UsageError(f"{flag}: {path}: {key} = {value!r}: choose from {', '.join(action.choices)}")
        values[dest] = value
    return values


def write_config(path: Path, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every setting of `args` as TOML, named as the flags; a setting left unset is left out."""
    table = {dest.replace("_", "-"): str(value) if isinstance(value, Path) else value
             for dest in settings(parser) if (value := getattr(args, dest)) is not None}
    header = f"# {parser.prog}: the resolved settings of this run (--config reads this file)\n"
    write_atomically(path, [(header + tomli_w.dumps(table)).encode()])


def parse_run_flags(parser: argparse.ArgumentParser, argv: list[str], resumable: tuple[str, ...]):
    """(args, run_dir, resuming): the flags, with ``--config`` as defaults under them, or with ``--resume`` the
    run directory's own config, where only the `resumable` settings may change."""
    args = parser.parse_args(argv)
    given = given_flags(parser, argv)
    if args.resume is not None:
        changed = sorted(given - {"resume", *resumable})
        if changed:
            allowed = ", ".join(f"--{name.replace('_', '-')}" for name in resumable)
            raise UsageError(f"--resume: a resumed run keeps the settings in {args.resume / CONFIG}; only {allowed} "
                             f"may change (got --{changed[0].replace('_', '-')})")
        if not (args.resume / CONFIG).is_file():
            raise UsageError(f"--resume: {args.resume} is not a run directory (it has no {CONFIG})")
        parser.set_defaults(**read_config(parser, args.resume / CONFIG, "--resume"))
        return parser.parse_args(argv), args.resume, True
    if args.config is not None:
        parser.set_defaults(**read_config(parser, args.config, "--config"))
        args = parser.parse_args(argv)
    command = parser.prog.split()[-1].rsplit(".", 1)[-1]  # "train", or "lm" for python -m uform.lm
    return args, args.run_dir or Path("runs") / time.strftime(f"{command}-%Y%m%d-%H%M%S"), False


def add_run_flags(parser: argparse.ArgumentParser, *, save_every: int, eval_every: int) -> None:
    """The flags every training command has: where the run goes, and how often it saves and evaluates."""
    runs = parser.add_argument_group("the run directory")
    runs.add_argument("--config", type=Path, metavar="TOML",
                      help="read settings from a TOML file, named as the flags (paths relative to the working "
                           "directory); flags given as well win (default: none)")
    runs.add_argument("--run-dir", type=Path, metavar="DIR", help="where the config, metrics, plot and checkpoints "
                                                                  "go (default: runs/<command>-<time>)")
    runs.add_argument("--resume", type=Path, metavar="RUN_DIR",
                      help="continue the run in RUN_DIR from its newest checkpoint, with its settings "
                           "(default: none, a new run)")
    runs.add_argument("--save-every", type=non_negative_int, default=save_every, metavar="STEPS",
                      help="write a checkpoint every STEPS steps (0: only the final one)")
    runs.add_argument("--keep", type=positive_int, default=3, metavar="N", help="step checkpoints kept")
    runs.add_argument("--eval-every", type=non_negative_int, default=eval_every, metavar="STEPS",
                      help="evaluate on the held-out data every STEPS steps, and at the end (0: only at the end)")


def device_executor(args) -> Executor:
    """The executor --device (or, where the program has it, --devices) names, else the default one."""
    devices = getattr(args, "devices", None)
    if devices and args.device:
        raise UsageError("--device and --devices: pass one of them")
    try:
        if devices:
            return devices_executor(devices)
        return executor_from(args.device) if args.device else default_executor()
    except (ValueError, RuntimeError) as error:
        raise UsageError(f"--{'devices' if devices else 'device'}: {error}") from None


def falls_on(step: int, period: int) -> bool:
    """Whether an action every `period` steps (0: never) falls on `step`."""
    return period > 0 and step % period == 0


# ---- the run directory -----------------------------------------------------------------------------------


def saved_once(write):
    """`write(step) -> path` made to write each step's checkpoint once: a second call for the step it wrote last
    answers that path again. A signal can stop a run on a step that --save-every just saved, and the run's
    close saves its last step."""
    last: list[tuple[int, Path]] = []

    def save(step: int) -> Path:
        if not last or last[0][0] != step:
            last[:] = [(step, write(step))]
        return last[0][1]

    return save


PLAIN_PROGRESS_LINES = 20  # lines a run's progress takes where its output is not a terminal


class PlainProgress:
    """A run's progress where stderr is not a terminal (a redirected log): one plain line every `every` steps and at
    the last, its step, rate and the loop's latest figures, instead of a bar's redraws. The calls of tqdm's bar
    that the programs make."""

    def __init__(self, total: int, initial: int, every: int):
        self.total, self.step, self.every = total, initial, every
        self.figures: dict[str, str] = {}
        self.began, self.began_at = time.perf_counter(), initial

    def update(self) -> None:
        self.step += 1
        if falls_on(self.step, self.every) or self.step == self.total:
            rate = (self.step - self.began_at) / max(time.perf_counter() - self.began, 1e-9)
            figures = "".join(f", {name} {value}" for name, value in self.figures.items())
            print(f"step {self.step}/{self.total}: {rate:.2f} steps/s{figures}", file=sys.stderr, flush=True)

    def set_postfix(self, **figures) -> None:
        self.figures = {name: str(value) for name, value in figures.items()}

    def write(self, text: str, file=None) -> None:
        print(text, file=file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


def step_progress(total: int, initial: int):
    """The progress of a run of `total` steps from `initial`: tqdm's bar on a terminal, else PlainProgress's
    lines, about PLAIN_PROGRESS_LINES of them."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit="step", file=sys.stderr, dynamic_ncols=True)
    return PlainProgress(total, initial, max(1, -(-(total - initial) // PLAIN_PROGRESS_LINES)))


def write_summary(path: Path, summary: dict) -> None:
    """The run's closing summary, what its last lines say, as JSON (atomically)."""
    write_atomically(path, [json.dumps(summary, indent=2).encode() + b"\n"])


def save_when_due(progress, step: int, args, save) -> None:
    """A periodic checkpoint every --save-every steps (the run's last step is saved by :func:`close_run`)."""
    if falls_on(step, args.save_every) and step < args.steps:
        progress.write(f"step {step}: saved {save(step)}", file=sys.stderr)


def close_run(progress, metrics, save, step: int, began: float, final: Path | None) -> tuple[Path, float]:
    """Ends a run's loop: the progress bar closed, the last checkpoint saved, the metrics flushed, and for a run
    whose steps are all taken `final` (the run's model file) made that checkpoint; answers it and the seconds since
    `began`. Called under the loop's GracefulStop, so that a signal now cannot cut the save or the link."""
    progress.close()
    last = save(step)
    elapsed = time.perf_counter() - began
    metrics.close()
    if final is not None:
        link_final(last, final)
    return last, elapsed


def no_steps_left(run_dir: Path, start: int, steps: int, newest: Path | None, final: Path) -> bool:
    """For a run that took `start` of its `steps`: False while steps are left. A resumed run whose steps are all
    taken but whose `final` model is missing (a signal after its last save) gets it from the `newest` checkpoint:
    True, said on stdout. Any other run with none left is refused (pass --steps with more)."""
    if start < steps:
        return False
    if newest is not None and start == steps and not final.exists():
        link_final(newest, final)
        print(f"the run in {run_dir} took all its {steps} steps; {final.name} is its last checkpoint, {newest.name}")
        return True
    raise UsageError(f"--steps: the run in {run_dir} already took {start} steps; pass --steps with more")


def stopped_early(stop, step: int, args, last: Path, resume: str) -> int | None:
    """The exit status of a run a signal stopped before its last step, after saying how to continue
    (`resume`: the command that does); None for a run that finished."""
    if stop.signal is None or step >= args.steps:
        return None
    print(f"stopped by {stop.signal_name} after step {step} of {args.steps}, saved {last}; continue with: {resume}")
    return stop.exit_status


def prepare_run_dir(run_dir: Path, resuming: bool, flag: str) -> None:
    """Create the run directory and its checkpoints folder, prove both writable and take the directory's lock
    (held until the process ends), before any training. A new run refuses a directory that already holds one, or
    checkpoints of one; any run refuses a directory another process is training in."""
    if not resuming and (run_dir / CONFIG).exists():
        raise UsageError(f"{flag}: {run_dir} already holds a run; continue it with --resume {run_dir}, or pick "
                         "another --run-dir")
    if not resuming and (run_dir / CHECKPOINTS).is_dir() and any((run_dir / CHECKPOINTS).iterdir()):
        raise UsageError(f"{flag}: {run_dir / CHECKPOINTS} holds files but {run_dir} no {CONFIG}: not this run's "
                         "checkpoints; pick another --run-dir")
    for folder in (run_dir, run_dir / CHECKPOINTS):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise UsageError(f"{flag}: cannot write to {folder}: {error.strerror or error}; pick another "
                             f"{flag}") from None
    if run_dir.resolve() in _HELD_LOCKS:  # this process's own earlier run of the directory (a resume in-process)
        return
    lock = open(run_dir / LOCK, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise UsageError(f"{flag}: another process is training in {run_dir} (it holds {LOCK}); wait for it, or pick "
                         "another --run-dir") from None
    _HELD_LOCKS[run_dir.resolve()] = lock
    atexit.register(lock.close)  # the lock goes with the process; closing it then says so


def check_writable(path: Path, flag: str) -> None:
    """Refuse a file path that cannot be written, without creating it."""
    probe = path.parent / f".{path.name}.write-test-{os.getpid()}"
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"{flag}: cannot write {path}: {error.strerror or error}") from None


def checkpoint_path(run_dir: Path, step: int, extension: str) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:07d}{extension}"


def step_checkpoints(run_dir: Path, extension: str) -> list[tuple[int, Path]]:
    """(step, path) of every step checkpoint in the run, oldest first."""
    found = []
    for path in (run_dir / CHECKPOINTS).glob(f"step-*{extension}"):
        match = re.fullmatch(rf"step-(\d+){re.escape(extension)}", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_checkpoint(run_dir: Path, extension: str) -> tuple[int, Path]:
    found = step_checkpoints(run_dir, extension)
    if not found:
        raise UsageError(f"--resume: {run_dir / CHECKPOINTS} holds no checkpoint yet (the run stopped before saving "
                         "one); start it afresh with another --run-dir")
    return found[-1]


def prune_checkpoints(run_dir: Path, extension: str, keep: int) -> None:
    for _, path in step_checkpoints(run_dir, extension)[:-keep]:
        path.unlink()


def link_final(checkpoint: Path, final: Path) -> None:
    """Make `final` the same file as `checkpoint` (a hard link, else a copy), replacing any older one."""
    temporary = final.with_name(f".{final.name}.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(checkpoint, temporary)
    except OSError:
        import shutil

        shutil.copyfile(checkpoint, temporary)
    os.replace(temporary, final)


# ---- metrics and the plot --------------------------------------------------------------------------------


class Metrics:
    """metrics.csv: one row per step, flushed as it is written; a resumed run first drops the rows past the
    step it resumes from (those steps run again)."""

    def __init__(self, path: Path, columns: list[str], resumed_at: int | None):
        self.path, self.columns = path, columns
        self.rows: list[dict] = []
        if resumed_at is not None and path.exists():
            with open(path, newline="") as file:
                for row in csv.DictReader(file):
                    if not row.get("step", "").isdigit() or None in row or None in row.values():
                        break  # a row a killed write cut short or garbled: it and any after it are dropped
                    if int(row["step"]) <= resumed_at:
                        self.rows.append(row)
        text = io.StringIO()
        writer = csv.DictWriter(text, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomically(path, [text.getvalue().encode()])
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, columns, lineterminator="\n")

    def add(self, **values) -> None:
        row = {name: format_value(values.get(name)) for name in self.columns}
        self._writer.writerow(row)
        self._file.flush()
        self.rows.append(row)

    def best(self, column: str, lowest: bool = False) -> tuple[float, int] | None:
        """(highest value, or with `lowest` the lowest, and the first step that reached it) of a column, or
        None when no row has it."""
        sign = -1 if lowest else 1
        scored = [(float(row[column]), int(row["step"])) for row in self.rows if row[column]]
        return max(scored, key=lambda pair: (sign * pair[0], -pair[1])) if scored else None

    def latest(self, column: str) -> float | None:
        values = [float(row[column]) for row in self.rows if row[column]]
        return values[-1] if values else None

    def close(self) -> None:
        self._file.close()


def format_value(value) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def plot(metrics: Metrics, path: Path, losses: list[str], held_out: str | None, title: str,
         reference: tuple[str, float] | None = None) -> None:
    """Draw the loss columns against the step, and any held-out column on a second axis with a `reference`
    (label, value) line, to `path` (PNG, replaced whole)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.add_subplot()
    steps = [int(row["step"]) for row in metrics.rows]
    for column in losses:
        points = [(s, float(row[column])) for s, row in zip(steps, metrics.rows) if row[column]]
        if points:
            axes.plot(*zip(*points), label=column.replace("_", " "), linewidth=1)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.legend(loc="upper left")
    points = [(s, float(row[held_out])) for s, row in zip(steps, metrics.rows) if row[held_out]] if held_out else []
    if points:
        other = axes.twinx()
        other.plot(*zip(*points), "o-", color="black", label=held_out.replace("_", " "))
        highest = max(value for _, value in points)
        if reference is not None:
            other.axhline(reference[1], color="gray", linestyle="--", label=reference[0])
            highest = max(highest, reference[1])
        other.set_ylim(0, 1.35 * highest or 1)  # room above the lines for the legends
        other.set_ylabel(held_out.replace("_", " "))
        other.legend(loc="upper right")
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    write_atomically(path, [image.getvalue()])


# ---- stopping ------------------------------------------------------------------------------------------------


class GracefulStop:
    """While active, SIGINT and SIGTERM set ``signal`` instead of stopping the process: the loop finishes its
    step, saves and exits. A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def _handle(self, number, frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = number
        print(f"\n{signal.Signals(number).name}: finishing the steps under way, then saving (again to stop at once)",
              file=sys.stderr)

    def __enter__(self) -> GracefulStop:
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exception) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal).name

    @property
    def exit_status(self) -> int:
        """The shell's status for a process a signal stopped: 128 + its number."""
        return 128 + self.signal


def run_command(command, argv: list[str], prog: str) -> None:
    """Run a command, turning a refused setting into one line on stderr and exit status 2."""
    try:
        status = command(argv)
    except UsageError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(status or 0)
