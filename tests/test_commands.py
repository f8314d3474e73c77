"""The commands of the README, end to end: ``python -m uform train`` and ``embed``, and ``python -m uform.lm``.

Most runs call the commands' ``main`` in this process (a tiny CPU model, a few steps); the stop-and-resume
test runs the train job as a real process, so that it receives a real SIGINT.
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import uform
from uform.__main__ import main as uform_main
from uform.lm.__main__ import main as lm_main
from uform.pairs import Pair, write_pairs

# The commands run in a scratch folder; they must find this uform however it was installed.
ENVIRONMENT = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(Path(uform.__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]))
TINY = ["--depth", "1", "--hidden", "128", "--columns", "48", "--device", "cpu"]


def command(main, argv, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a command's main run in this process."""
    with pytest.raises(SystemExit) as exit:
        main(argv)
    out, err = capsys.readouterr()
    return exit.value.code or 0, out, err


def write_numbered_pairs(path: Path, count: int) -> Path:
    write_pairs(path, [Pair(query=f"what does function number {i} do", document=f"def function_{i}(x, y={i})")
                       for i in range(count)])
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run directory of 4 steps on 12 pairs, 4 held out, checkpoints every 2 steps."""
    folder = tmp_path_factory.mktemp("trained")
    pairs = write_numbered_pairs(folder / "pairs.jsonl", 12)
    with pytest.raises(SystemExit) as exit:
        uform_main(["train", "--pairs", str(pairs), "--steps", "4", "--pairs-per-step", "4", "--held-out", "4",
                    "--save-every", "2", "--eval-every", "2", "--keep", "1", "--run-dir", str(folder / "run"), *TINY])
    assert exit.value.code == 0
    return folder


def test_train_job_writes_its_run_directory(trained):
    run = trained / "run"
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoints", "config.toml", "loss.png", "metrics.csv",
                                                    "model.safetensors", "summary.json"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000004.safetensors"]
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [row["step"] for row in rows] == ["1", "2", "3", "4"]
    assert [bool(row["held_out_recall_at_1"]) for row in rows] == [False, True, False, True]
    assert all(float(row["loss"]) > 0 and float(row["learning_rate"]) > 0 for row in rows)
    assert 'pairs-per-step = 4' in (run / "config.toml").read_text()
    assert (run / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert uform.Encoder.load(run / "model.safetensors", "cpu").steps == 4
    summary = json.loads((run / "summary.json").read_text())
    held = summary["held_out"]
    assert (summary["first_step"], summary["steps"], summary["query_modality"], held["pairs"]) == (1, 4, "text", 4)
    assert held["recall_at_1"] == float(rows[-1]["held_out_recall_at_1"]) and held["best_step"] in (2, 4)
    assert set(held["baselines"]) == {"bag-of-bytes", "BM25"} and summary["seconds"] > 0


def test_train_warmup_steps_set_the_warmup(tmp_path):
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    with pytest.raises(SystemExit) as exit:
        uform_main(["train", "--pairs", str(pairs), "--steps", "4", "--pairs-per-step", "4", "--held-out", "0",
                    "--warmup-steps", "3", "--save-every", "0", "--run-dir", str(tmp_path / "run"), *TINY])
    assert exit.value.code == 0
    rates = [float(row["learning_rate"]) for row in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))]
    assert rates[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3], rel=1e-6) and rates[3] < 1e-3
    assert "warmup-steps = 3" in (tmp_path / "run" / "config.toml").read_text()


@pytest.mark.parametrize("warmup,named", [("5", "schedule.warmup_steps: 5 exceeds steps 4"), ("-1", "--warmup-steps")])
def test_train_refuses_a_warmup_it_cannot_take_in_one_line(tmp_path, capsys, warmup, named):
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    run = tmp_path / "run"
    status, _, err = command(uform_main, ["train", "--pairs", str(pairs), "--steps", "4", "--pairs-per-step", "4",
                                          "--held-out", "4", "--warmup-steps", warmup, "--run-dir", str(run), *TINY],
                             capsys)
    assert status == 2 and named in err and err.count("\n") == 1
    assert not (run / "model.safetensors").exists() and not list(run.glob("checkpoints/*"))


def test_embed_a_jsonl_file(trained, capsys):
    items = trained / "items.jsonl"
    items.write_text('{"text": "what does function number 3 do"}\n"def function_3(x, y=3)"\n\n{"text": "hi"}\n')
    status, out, _ = command(uform_main, ["embed", str(trained / "run" / "model.safetensors"), str(items),
                                          "-o", str(trained / "items.npy"), "--device", "cpu", "--batch-size", "2"],
                             capsys)
    assert status == 0 and "3 embeddings of width 128" in out
    expected = uform.Encoder.load(trained / "run" / "model.safetensors", "cpu").encode(
        uform.Modality.TEXT, ["what does function number 3 do", "def function_3(x, y=3)", "hi"])
    assert np.array_equal(np.load(trained / "items.npy"), expected)

    status, _, err = command(uform_main, ["embed", str(trained / "pairs.jsonl"), str(items)], capsys)
    assert status == 2 and err.count("\n") == 1 and "pairs.jsonl is not a safetensors file" in err
    status, _, err = command(uform_main, ["embed", str(trained / "run" / "model.safetensors"),
                                          str(trained / "pairs.jsonl"), "--device", "cpu"], capsys)
    assert status == 2 and "pairs.jsonl:1: no 'text' key (name the item's key with --field)" in err
    model = str(trained / "run" / "model.safetensors")
    status, _, err = command(uform_main, ["embed", model, str(items), "-o", str(trained / "w.npy"), "--device", "cpu",
                                          "--width", "64"], capsys)
    assert status == 2 and "width: the run trained the widths [128], not 64" in err
    status, out, _ = command(uform_main, ["embed", model, str(items), "-o", str(trained / "w.npy"), "--device", "cpu",
                                          "--width", "64", "--any-width"], capsys)
    assert status == 0 and np.load(trained / "w.npy").shape == (3, 64)
    status, _, err = command(uform_main, ["embed", model, "/dev/zero", "-o", str(trained / "z.npy")], capsys)
    assert status == 2 and "INPUT: /dev/zero:1: a line longer than" in err


def test_choose_writes_each_states_probabilities(trained, capsys):
    states = trained / "states.jsonl"
    states.write_text('{"text": "is 3 odd", "choices": "yn"}\n\n{"text": "pick", "choices": "abc", "id": 7}\n')
    checkpoint = trained / "run" / "model.safetensors"
    status, out, _ = command(uform_main, ["choose", str(checkpoint), str(states), "-o", str(trained / "out.jsonl"),
                                          "--device", "cpu"], capsys)
    assert status == 0 and "the probabilities of 2 states" in out
    lines = [json.loads(line) for line in (trained / "out.jsonl").read_text().splitlines()]
    expected = uform.Encoder.load(checkpoint, "cpu").text_choose(["is 3 odd", "pick"], ["yn", "abc"])
    assert [line["probabilities"] for line in lines] == [expected.entry(0).tolist(), expected.entry(1).tolist()]
    assert lines[1]["id"] == 7 and lines[1]["choices"] == "abc"
    states.write_text('{"text": "is 3 odd", "choices": "yé"}\n')
    status, _, err = command(uform_main, ["choose", str(checkpoint), str(states), "--device", "cpu"], capsys)
    assert status == 2 and err.count("\n") == 1 and "states.jsonl:1: every choice must be one byte" in err


@pytest.mark.parametrize("argv,flag", [
    (["train", "--run-dir", "{file}/run"], "--run-dir"),
    (["train", "--run-dir", "{file}"], "--run-dir"),
    (["embed", "{file}", "{file}", "-o", "{file}/out.npy"], "--output"),
    (["choose", "{file}", "{file}", "-o", "{file}/out.jsonl"], "--output"),
])
def test_unwritable_outputs_are_refused_before_anything_runs(tmp_path, capsys, argv, flag):
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    argv = [part.format(file=pairs) for part in argv]
    if argv[0] == "train":
        argv += ["--pairs", str(pairs), "--pairs-per-step", "4", "--held-out", "4", "--steps", "100000", *TINY]
    status, out, err = command(uform_main, argv, capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and f"error: {flag}: cannot write" in err


def test_ten_pairs_with_default_flags_are_refused_saying_what_to_change(tmp_path, capsys):
    pairs = write_numbered_pairs(tmp_path / "ten.jsonl", 10)
    status, _, err = command(uform_main, ["train", "--pairs", str(pairs), "--run-dir", str(tmp_path / "run"), *TINY],
                             capsys)
    assert status == 2 and not (tmp_path / "run").exists()
    assert err.splitlines() == [
        "--held-out 500: holding out 5, half of the 10 pairs",
        "python -m uform train: error: --pairs-per-step: a step draws 128 distinct pairs but only 5 of the 10 are left "
        "for training (5 held out); pass --pairs-per-step 5 or fewer, or more pairs"]


def test_eval_pairs_hold_out_a_file_and_keep_its_items_out_of_training(tmp_path, capsys):
    """--eval-pairs evaluates on a file's pairs instead of a split; training pairs that share a query or a document
    with it are left out (and counted), and the held-out recall is the file's."""
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    evaluation = write_numbered_pairs(tmp_path / "eval.jsonl", 3)  # functions 0-2, which pairs.jsonl holds too
    status, out, err = command(uform_main, ["train", "--pairs", str(pairs), "--eval-pairs", str(evaluation),
                                            "--steps", "2", "--pairs-per-step", "4", "--run-dir",
                                            str(tmp_path / "run"), *TINY], capsys)
    assert status == 0 and "--eval-pairs: 3 of the 12 training pairs share a query or a document" in err
    assert "recall@1 over 3 pairs" in out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["held_out"]["pairs"] == 3
    status, _, err = command(uform_main, ["train", "--pairs", str(pairs), "--eval-pairs", str(tmp_path / "none"),
                                          "--run-dir", str(tmp_path / "other"), *TINY], capsys)
    assert status == 2 and "--eval-pairs: cannot read" in err


def test_a_signal_at_the_final_link_still_ends_with_the_model(tmp_path, capsys, monkeypatch):
    """The final save and the model's link run under the loop's signal handlers: a SIGINT landing there lets them
    finish, and the run ends with its model."""
    from uform import runs

    link = runs.link_final

    def interrupted_link(checkpoint, final):
        os.kill(os.getpid(), signal.SIGINT)
        link(checkpoint, final)

    monkeypatch.setattr(runs, "link_final", interrupted_link)
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    status, _, err = command(uform_main, ["train", "--pairs", str(pairs), "--steps", "2", "--pairs-per-step", "4",
                                          "--held-out", "4", "--save-every", "0", "--run-dir", str(tmp_path / "run"),
                                          *TINY], capsys)
    assert status == 0 and "SIGINT: finishing the steps under way" in err
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_a_finished_run_without_its_model_gets_it_on_resume(tmp_path, capsys):
    """A run whose steps are all taken but whose model.safetensors is missing (a signal after the last save) is
    finished by --resume: the model is its last checkpoint. With the model there, --resume asks for more steps."""
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    run = tmp_path / "run"
    status, _, _ = command(uform_main, ["train", "--pairs", str(pairs), "--steps", "2", "--pairs-per-step", "4",
                                        "--held-out", "4", "--run-dir", str(run), *TINY], capsys)
    model = run / "model.safetensors"
    saved = model.read_bytes()
    model.unlink()
    status, out, _ = command(uform_main, ["train", "--resume", str(run)], capsys)
    assert status == 0 and "took all its 2 steps" in out and model.read_bytes() == saved
    status, _, err = command(uform_main, ["train", "--resume", str(run)], capsys)
    assert status == 2 and "already took 2 steps; pass --steps with more" in err


def test_a_run_owns_its_directory(tmp_path, capsys):
    """Another process training in a run directory (holding its lock) refuses this one; so do a new run's
    checkpoints of another run; a garbled metrics.csv row is dropped on --resume."""
    import fcntl

    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    flags = ["--pairs", str(pairs), "--steps", "2", "--pairs-per-step", "4", "--held-out", "4", *TINY]
    busy = tmp_path / "busy"
    busy.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
                               "time.sleep(60)", str(busy / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        status, _, err = command(uform_main, ["train", "--run-dir", str(busy), *flags], capsys)
        assert status == 2 and "another process is training in" in err
    finally:
        holder.kill()
    foreign = tmp_path / "foreign"
    (foreign / "checkpoints").mkdir(parents=True)
    (foreign / "checkpoints" / "step-0000009.safetensors").write_bytes(b"x")
    status, _, err = command(uform_main, ["train", "--run-dir", str(foreign), *flags], capsys)
    assert status == 2 and "holds files but" in err and "not this run's checkpoints" in err
    run = tmp_path / "run"
    assert command(uform_main, ["train", "--run-dir", str(run), *flags, "--steps", "1"], capsys)[0] == 0
    with open(run / "metrics.csv", "a") as file:
        file.write("\0\0\0,0.5")  # a garbled row (a crash can leave zeros where a write was under way)
    status, _, _ = command(uform_main, ["train", "--resume", str(run), "--steps", "2"], capsys)
    assert status == 0 and [row["step"] for row in csv.DictReader(open(run / "metrics.csv"))] == ["1", "2"]


def test_a_binary_config_and_an_empty_prompt_are_one_line(tmp_path, capsys):
    (tmp_path / "binary.toml").write_bytes(bytes(range(256)))
    status, _, err = command(uform_main, ["train", "--config", str(tmp_path / "binary.toml")], capsys)
    assert status == 2 and err.count("\n") == 1 and "is not TOML: not UTF-8 text (byte 128)" in err
    status, _, err = command(lm_main, ["--prompt", "", "--run-dir", str(tmp_path / "lm")], capsys)
    assert status == 2 and err.count("\n") == 1 and "--prompt: the sample continues a text" in err


def test_a_redirected_run_writes_plain_progress_lines(tmp_path, capsys):
    """Where stderr is not a terminal, the run's progress is a plain line every steps/20 steps and at the last (a
    step, its rate and the loss), never a bar's carriage-return redraws."""
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    status, _, err = command(uform_main, ["train", "--pairs", str(pairs), "--steps", "40", "--pairs-per-step", "4",
                                          "--held-out", "4", "--run-dir", str(tmp_path / "run"), *TINY], capsys)
    lines = [line for line in err.splitlines() if " steps/s, loss " in line]
    assert status == 0 and "\r" not in err
    assert [line.split(":")[0] for line in lines] == [f"step {2 * k}/40" for k in range(1, 21)]


def test_ten_pairs_with_no_held_out_train_from_a_toml_config(tmp_path, capsys):
    pairs = write_numbered_pairs(tmp_path / "ten.jsonl", 10)
    (tmp_path / "run.toml").write_text(f'pairs = "{pairs}"\nheld-out = 0\npairs_per_step = 10\nsteps = 2\n')
    status, out, _ = command(uform_main, ["train", "--config", str(tmp_path / "run.toml"), "--run-dir",
                                          str(tmp_path / "run"), *TINY], capsys)
    assert status == 0 and "no held-out pairs, so no recall (--held-out 0)" in out
    assert "held-out = 0" in (tmp_path / "run" / "config.toml").read_text()
    assert (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    (["--hidden", "100"], "--hidden: must be a multiple of 128"),
    (["--data", "movies"], "argument --data: invalid choice: 'movies'"),
    (["--resume", "{tmp}"], "--resume: {tmp} is not a run directory (it has no config.toml)"),
    (["--config", "{tmp}/bad.toml"], "--config: {tmp}/bad.toml: unknown setting 'colour'"),
    (["--mask-ratio", "1"], "argument --mask-ratio: must lie strictly between 0 and 1, got 1"),
    (["--gradient-clip-norm", "-1"], "argument --gradient-clip-norm: must be 0 or a positive number, got -1"),
    (["--objective", "masked"], "argument --objective: invalid choice: 'masked'"),
])
def test_a_bad_flag_is_one_line_naming_it(tmp_path, capsys, argv, message):
    (tmp_path / "bad.toml").write_text("colour = 3\n")
    argv = [part.format(tmp=tmp_path) for part in argv]
    status, _, err = command(uform_main, ["train", *argv], capsys)
    assert status == 2 and err.startswith(f"python -m uform train: error: {message.format(tmp=tmp_path)}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("data,modality", [("shapes", "image"), ("sounds", "audio")])
def test_train_job_on_captioned_media(tmp_path, capsys, data, modality):
    status, out, err = command(uform_main, [
        "train", "--data", data, "--examples", "40", "--steps", "2", "--pairs-per-step", "4", "--held-out", "10",
        "--depth", "1", "--device", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert status == 0 and "30 training pairs, 10 held out" in err
    assert f"held-out {modality}→text recall@1 over 10 pairs" in out and "chance 0.100 " in out
    assert (tmp_path / "run" / "model.safetensors").stat().st_size > 0


def test_train_job_names_a_bad_pairs_line(tmp_path, capsys):
    (tmp_path / "pairs.jsonl").write_text('{"query": "a question here", "document": "an answer"}\n{"query": 1}\n')
    status, _, err = command(uform_main, ["train", "--pairs", str(tmp_path / "pairs.jsonl")], capsys)
    assert status == 2 and "pairs.jsonl:2" in err and err.count("\n") == 1


@pytest.mark.parametrize("main,argv", [(uform_main, ["--help"]), (uform_main, ["train", "--help"]),
                                       (uform_main, ["embed", "--help"]), (uform_main, ["choose", "--help"]),
                                       (lm_main, ["--help"])])
def test_every_command_has_help_and_every_flag_shows_its_default(capsys, main, argv):
    status, out, _ = command(main, argv, capsys)
    assert status == 0
    if argv == ["--help"] and main is uform_main:
        assert "train " in out and "embed " in out and "choose " in out
        return
    flags = [line.split()[0] for line in out.splitlines() if line.startswith("  --") and "--help" not in line]
    assert flags
    for flag in flags:
        text = out[out.index(f"\n  {flag}"):]
        following = text.find("\n  -", 1)
        assert "default" in text[:following if following > 0 else None], flag


def metrics(run: Path) -> list[tuple[str, str]]:
    return [(row["step"], row["loss"]) for row in csv.DictReader(open(run / "metrics.csv"))]


def tensors(path: Path) -> tuple[dict, dict]:
    with safe_open(path, framework="numpy") as file:
        return file.metadata(), {name: file.get_tensor(name) for name in file.keys()}


def test_resume_after_sigint_ends_bit_identical_to_an_uninterrupted_run(tmp_path, capsys):
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    flags = ["--pairs", str(pairs), "--steps", "30", "--pairs-per-step", "4", "--held-out", "4", "--save-every", "10",
             "--eval-every", "10", *TINY]
    interrupted = subprocess.Popen([sys.executable, "-m", "uform", "train", *flags, "--run-dir", "stopped"],
                                   cwd=tmp_path, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
    rows = tmp_path / "stopped" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (rows.exists() and len(rows.read_text().splitlines()) > 3) and interrupted.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    interrupted.send_signal(signal.SIGINT)
    out, err = interrupted.communicate(timeout=120)
    assert interrupted.returncode == 128 + signal.SIGINT, err
    assert "stopped by SIGINT after step" in out and "--resume" in out
    stopped_at = int(out.split("after step ")[1].split()[0])
    assert 3 <= stopped_at < 30 and len(metrics(tmp_path / "stopped")) == stopped_at

    assert command(uform_main, ["train", "--resume", str(tmp_path / "stopped")], capsys)[0] == 0
    assert command(uform_main, ["train", *flags, "--run-dir", str(tmp_path / "straight")], capsys)[0] == 0
    (metadata, resumed), (expected_metadata, expected) = (tensors(tmp_path / run / "model.safetensors")
                                                          for run in ("stopped", "straight"))
    assert metadata == expected_metadata and resumed.keys() == expected.keys()
    assert all(np.array_equal(resumed[name], expected[name]) for name in expected)
    assert metrics(tmp_path / "stopped") == metrics(tmp_path / "straight")


def test_language_model_demo_writes_a_run_and_resumes(tmp_path, capsys):
    argv = ["--steps", "2", "--device", "cpu", "--eval-every", "1", "--eval-batches", "1", "--sample-bytes", "8",
            "--run-dir", str(tmp_path / "lm")]
    status, out, _ = command(lm_main, argv, capsys)
    assert status == 0 and "lowest held-out loss" in out and "sample at temperature 0.8: def " in out
    run = tmp_path / "lm"
    assert {p.name for p in run.iterdir()} == {".lock", "checkpoints", "config.toml", "loss.png", "metrics.csv",
                                               "model.uformlm"}
    assert all(row["held_out_loss"] for row in csv.DictReader(open(run / "metrics.csv")))
    status, _, err = command(lm_main, ["--resume", str(run)], capsys)
    assert status == 2 and "--steps: the run in" in err and "already took 2 steps" in err
    status, out, _ = command(lm_main, ["--resume", str(run), "--steps", "3", "--temperature", "0"], capsys)
    assert status == 0 and "trained steps 3–3" in out and "sample at temperature 0.0" in out


def test_language_model_demo_refuses_a_corpus_too_short_for_its_windows(tmp_path, capsys):
    (tmp_path / "short.txt").write_text("x" * 100)
    status, _, err = command(lm_main, ["--corpus", str(tmp_path / "short.txt"), "--run-dir", str(tmp_path / "lm")],
                             capsys)
    assert status == 2 and not (tmp_path / "lm").exists()
    assert err == ("python -m uform.lm: error: --corpus: short.txt has 100 bytes, 90 for training and 10 held out; "
                   "each part needs a window of 65 bytes (a longer corpus, or --held-out-fraction 0)\n")


def test_a_step_checkpoint_is_written_once_when_a_stop_falls_on_a_save_step(tmp_path):
    """A signal can stop a run right after --save-every saved its step; closing the run saves the last step
    again only if it is another step."""
    from uform.runs import saved_once

    written = []

    @saved_once
    def save(step):
        written.append(step)
        return tmp_path / f"step-{step}"

    assert save(100) == tmp_path / "step-100" and save(100) == tmp_path / "step-100"
    assert save(101) == tmp_path / "step-101" and save(100) == tmp_path / "step-100"
    assert written == [100, 101, 100]


def test_train_job_on_names_beats_bag_of_bytes_and_bm25(tmp_path, capsys):
    """The default data: names across scripts, held out by English name. A small CPU run beats both baselines."""
    status, out, err = command(uform_main, [
        "train", "--steps", "150", "--pairs-per-step", "32", "--depth", "2", "--hidden", "128", "--eval-every", "0",
        "--save-every", "0", "--device", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert status == 0 and "500 held out" in err
    with open(tmp_path / "run" / "metrics.csv") as file:
        last = list(csv.DictReader(file))[-1]
    found = re.search(r"bag-of-bytes ([0-9.]+) · BM25 ([0-9.]+)", out)
    assert float(last["held_out_recall_at_1"]) > max(float(found[1]), float(found[2])) + 0.03
    assert float(last["held_out_mrr"]) >= float(last["held_out_recall_at_1"])
    assert float(last["held_out_recall_at_10"]) >= float(last["held_out_recall_at_1"])


def test_train_job_on_digits_reports_the_pixel_baseline(tmp_path, capsys):
    """Handwritten digits as zero-shot classification: ten captions, the held-out images ranked among them."""
    pytest.importorskip("sklearn")
    status, out, err = command(uform_main, [
        "train", "--data", "digits", "--examples", "300", "--steps", "3", "--pairs-per-step", "16", "--held-out", "60",
        "--depth", "1", "--device", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert status == 0 and "240 training pairs, 60 held out" in err
    found = re.search(r"chance 0\.100 · pixel logistic regression ([0-9.]+)", out)
    assert found and float(found[1]) > 0.6


def test_train_job_on_digits_without_scikit_learn_is_one_line(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # an import of it fails, as where it is not installed
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    status, _, err = command(uform_main, ["train", "--data", "digits", "--run-dir", str(tmp_path / "run")], capsys)
    assert status == 2 and "--data digits: the digits data set needs scikit-learn" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_train_job_on_spoken_words_without_espeak_is_one_line(tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    status, _, err = command(uform_main, ["train", "--data", "spoken", "--run-dir", str(tmp_path / "run")], capsys)
    assert status == 2 and "--data spoken: the spoken data set needs the espeak-ng program" in err
    assert err.count("\n") == 1


def test_train_on_several_devices_writes_one_devices_model(tmp_path, capsys, monkeypatch):
    """--devices cpu:2 trains the step's pairs as a world of two devices (each a row per pair of its half): the
    model it writes is the one --device cpu writes, byte for byte. Pairs that do not split evenly, and --device
    beside --devices, are refused."""
    pairs = write_numbered_pairs(tmp_path / "pairs.jsonl", 12)
    flags = ["train", "--pairs", str(pairs), "--steps", "3", "--pairs-per-step", "4", "--held-out", "4",
             "--save-every", "0", "--depth", "1", "--hidden", "128", "--columns", "48"]
    models, worlds = [], []
    init_vram = uform.Trainer.init_vram
    monkeypatch.setattr(uform.Trainer, "init_vram", lambda executor, **kw: (
        worlds.append((len(executor.devices), kw["batch"].max_rows_per_device)), init_vram(executor, **kw))[1])
    for devices in (["--device", "cpu"], ["--devices", "cpu:2"]):
        run = tmp_path / devices[1].replace(":", "-")
        status, _, err = command(uform_main, [*flags, "--run-dir", str(run), *devices], capsys)
        assert status == 0, err
        models.append((run / "model.safetensors").read_bytes())
    assert worlds == [(1, 4), (2, 2)] and models[0] == models[1]
    status, _, err = command(uform_main, [*flags, "--run-dir", str(tmp_path / "odd"), "--devices", "cpu:3"], capsys)
    assert status == 2 and "--pairs-per-step: 4 pairs do not split evenly over 3 devices" in err
    status, _, err = command(uform_main, [*flags, "--run-dir", str(tmp_path / "both"), "--devices", "cpu:2",
                                          "--device", "cpu"], capsys)
    assert status == 2 and "--device and --devices: pass one of them" in err
