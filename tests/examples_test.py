"""The examples: their checker findings, their messages and their plot.

Running the demo and the plot example as the docs show them, and what they
print, is tests/docs_commands_test.py's.
"""

import pathlib
import subprocess
import sys

import pytest

_DEMO = pathlib.Path(__file__).parents[1] / "examples" / "demo.py"


def test_examples_pass_the_checker():
    # The code users copy. examples/legacy/ shows legacy code on purpose.
    from tf_lso_migration import check

    examples = _DEMO.parent
    files = [p for p in check.python_files([examples])
             if "legacy" not in p.relative_to(examples).parts]
    assert len(files) >= 3
    findings = [f for path in files for f in check.check_file(path)]
    assert findings == []


def test_checkpoint_example_without_tensorboard_says_what_to_install(
        tmp_path):
    script = _DEMO.parent / "legacy" / "checkpoint_loop.py"
    code = (
        "import runpy, sys\n"
        "class NoTensorBoard:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'tensorboard':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoTensorBoard())\n"
        f"sys.argv = ['tf_lso', 'run', {str(script)!r}, '5']\n"
        "runpy.run_module('tf_lso', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "This example logs with tf.summary, which needs TensorBoard on "
        "TensorFlow 2.16+: pip install tensorboard (or pip install "
        '"tf_lso[examples]").')


def _plot_example():
    """examples/plot_training_health.py as a module (skips without
    matplotlib)."""
    pytest.importorskip(
        "matplotlib", reason="the plot example needs matplotlib: pip install "
        "'tf_lso[examples]'")
    sys.path.insert(0, str(_DEMO.parent))
    try:
        import plot_training_health
    finally:
        sys.path.remove(str(_DEMO.parent))
    return plot_training_health


def test_training_health_figure():
    # A person reads off when and why the scale moved: steps on a log2
    # axis, the skipped steps marked, the loss below, a title and labels.
    plot_training_health = _plot_example()
    scales = [8.0, 8.0, 16.0, 8.0, 8.0]
    skipped = [False, False, True, False, False]
    losses = [3.0, 2.0, 1e9, 1.5, 1.0]
    figure = plot_training_health.figure(scales, skipped, losses)
    assert figure.get_suptitle() == (
        "Loss scaling over 5 steps: 1 skipped for non-finite gradients")
    top, bottom = figure.axes
    assert (top.get_yscale(), top.yaxis.get_transform().base) == ("log", 2)
    assert top.get_ylabel() == "loss scale (log2)"
    curve, marks = top.get_lines()
    assert curve.get_drawstyle() == "steps-post"
    assert list(curve.get_ydata()) == scales
    assert (list(marks.get_xdata()), list(marks.get_ydata())) == ([2], [16.0])
    assert marks.get_linestyle() == "None" and marks.get_marker() == "x"
    loss, loss_marks = bottom.get_lines()
    assert list(loss.get_ydata()) == losses
    assert list(loss_marks.get_xdata()) == [2]
    assert bottom.get_yscale() == "log"
    assert (bottom.get_xlabel(), bottom.get_ylabel()) == ("step",
                                                          "loss (log)")
    assert [t.get_text() for t in top.get_legend().get_texts()] == [
        "loss scale", "skipped step (scale then halved)"]


def test_training_health_figure_with_gradient_reports():
    # --gradient-report: a third panel, the below-normal share in percent
    # and the headroom on a twin axis, step by step.
    plot_training_health = _plot_example()
    reports = [(0.0, 2.0), (0.25, 1.0), (0.5, -3.0)]
    figure = plot_training_health.figure([8.0, 8.0, 16.0], [False] * 3,
                                         [3.0, 2.0, 1.0], reports)
    _, middle, report, twin = figure.axes
    assert middle.get_xlabel() == ""
    assert report.get_xlabel() == ""  # The headroom's panel is below.
    assert twin.get_xlabel() == "step"
    assert report.get_ylabel() == "below float16 normal (%)"
    assert list(report.get_lines()[0].get_ydata()) == [0.0, 25.0, 50.0]
    assert twin.get_ylabel() == "headroom (doublings)"
    headroom = twin.get_lines()[0]
    assert headroom.get_drawstyle() == "steps-post"
    assert list(headroom.get_ydata()) == [2.0, 1.0, -3.0]


def _overlap(a, b):
    return (a.x0 < b.x1 and b.x0 < a.x1) and (a.y0 < b.y1 and b.y0 < a.y1)


def test_an_overflowed_step_is_marked_on_the_headroom_panel():
    # Its headroom is -inf, which a line leaves out (the walk-through of
    # issue 51 saw no dip at the demo's step 291): a marker on the floor.
    plot_training_health = _plot_example()
    steps = 10
    skipped = [step == 6 for step in range(steps)]
    reports = [(0.0, float("-inf") if bad else 3.0) for bad in skipped]
    figure = plot_training_health.figure(
        [2.0**15] * steps, skipped, [1.0] * steps, reports)
    headroom = figure.axes[-1]
    [marker] = [line for line in headroom.get_lines()
                if line.get_label().startswith("overflowed")]
    assert list(marker.get_xdata()) == [6]
    assert list(marker.get_ydata()) == [headroom.get_ylim()[0]]
    assert marker.get_label() == "overflowed: no\nheadroom (−∞)"
    assert marker in headroom.get_legend().get_lines() or any(
        text.get_text() == marker.get_label()
        for text in headroom.get_legend().get_texts())


def test_training_health_panels_read_without_the_docs():
    # Issue 51: a share axis from 0 (the share is never negative), the
    # headroom on its own axis with its zero drawn and labelled, legends
    # beside the data (not on the spike of a skipped step), 2**-14 as math.
    plot_training_health = _plot_example()
    steps = 300
    skipped = [step in (150, 250) for step in range(steps)]
    scales = [2.0**15] * steps
    losses = [1e11 if bad else 2.0 for bad in skipped]
    reports = [(0.0, -16.0 if bad else 2.0 - step // 200)
               for step, bad in enumerate(skipped)]
    figure = plot_training_health.figure(scales, skipped, losses, reports)
    figure.canvas.draw()
    top, loss, share, headroom = figure.axes
    assert share.get_ylim()[0] == 0 and share.get_ylim()[1] > 0
    assert share.get_lines()[0].get_zorder() > share.spines["bottom"].zorder
    assert headroom not in (share, *share.get_shared_y_axes().get_siblings(
        share))
    assert not _overlap(share.get_window_extent(),
                        headroom.get_window_extent())  # Its own panel.
    low, high = headroom.get_ylim()
    assert low < -16 and high > 2
    [zero] = [line for line in headroom.get_lines()
              if list(line.get_ydata()) == [0, 0]]
    assert zero.get_label() == "0: at float16's maximum\n(below 0: beyond it)"
    assert "0" in [t.get_text() for t in headroom.get_yticklabels()]
    labels = {line.get_label() for axis in figure.axes
              for line in axis.get_lines()}
    assert ("gradient elements\nbelow $2^{-14}$, float16's\nsmallest normal"
            in labels)
    assert not any("**" in label for label in labels)
    figure_box = figure.bbox
    for axis in figure.axes:
        legend = axis.get_legend()
        box = legend.get_window_extent()
        # On no panel's data area, and inside the saved image.
        for other in figure.axes:
            assert not _overlap(box, other.get_window_extent()), (
                axis.get_ylabel(), other.get_ylabel())
        assert (box.x0 >= figure_box.x0 and box.x1 <= figure_box.x1
                and box.y0 >= figure_box.y0 and box.y1 <= figure_box.y1)
    # The loss's legend is off the spike of step 250 and its marker.
    spike = loss.transData.transform((250, 1e11))
    assert not loss.get_legend().get_window_extent().contains(*spike)
