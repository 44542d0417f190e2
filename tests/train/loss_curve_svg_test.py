"""The loss-curve SVGs parse as XML (xml.etree, an independent parser) and hold what a reader
needs: an <svg> root in the SVG namespace, the train line, the validation line and markers when
there is validation, a legend, a title, and numeric tick labels on both axes.

usage: loss_curve_svg_test.py LOSS_CURVE_TEST SCRATCH_DIR
LOSS_CURVE_TEST writes the samples (its LossCurve.Samples case) into $HYBRIDLM_SVG_OUT.
"""
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def main():
    runner, scratch = sys.argv[1], sys.argv[2]
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    env = dict(os.environ, HYBRIDLM_SVG_OUT=scratch)
    subprocess.run([runner, "--gtest_filter=LossCurve.Samples"], env=env, check=True, stdout=subprocess.DEVNULL)

    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    # file -> (train polylines, validation points, title)
    want = {
        "both.svg": (1, 10, 'tiny <run> & "friends"'),
        "no_validation.svg": (1, 0, "train only"),
        "empty.svg": (0, 0, "nothing yet"),
        "nan.svg": (2, 1, "a NaN step"),
        "one_point.svg": (1, 0, "\ufffd bad utf-8 \ufffd\ufffd"),
    }
    for name, (lines, val_points, title) in want.items():
        path = os.path.join(scratch, name)
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            failures.append(f"{name}: not well-formed XML: {e}")
            continue
        expect(root.tag == NS + "svg", f"{name}: root is {root.tag}")
        by_class = {}
        for el in root.iter():
            by_class.setdefault(el.get("class"), []).append(el)
        train = [e for e in by_class.get("train", []) if e.tag == NS + "polyline"]
        expect(len(train) == lines, f"{name}: {len(train)} train polylines, want {lines}")
        for pl in train:
            for pt in pl.get("points").split():
                x, y = (float(v) for v in pt.split(","))
                expect(0 <= x <= 800 and 0 <= y <= 480, f"{name}: train point {pt} outside the canvas")
        markers = by_class.get("validation-point", [])
        expect(len(markers) == val_points, f"{name}: {len(markers)} validation markers, want {val_points}")
        if val_points:
            expect(len(by_class.get("validation", [])) >= 1, f"{name}: no validation line")
        titles = [e.text for e in by_class.get("title", [])]
        expect(titles == [title], f"{name}: title {titles!r}, want {title!r}")
        legend = by_class.get("legend", [])
        expect(len(legend) == 1, f"{name}: {len(legend)} legends")
        if legend:
            names = [t.text for t in legend[0].iter(NS + "text")]
            expect(names == (["train", "validation"] if val_points else ["train"]), f"{name}: legend {names}")
        labels = [e.text for e in by_class.get("label", [])]
        expect(labels == ["step", "loss"], f"{name}: axis labels {labels}")
        for axis in ("x-axis", "y-axis"):
            groups = by_class.get(axis, [])
            ticks = [t.text for g in groups for t in g.iter(NS + "text")]
            expect(len(ticks) >= 3, f"{name}: {axis} has {len(ticks)} tick labels")
            for t in ticks:
                try:
                    float(t)
                except (TypeError, ValueError):
                    failures.append(f"{name}: {axis} tick label {t!r} is not a number")

    for f in failures:
        print("FAIL:", f)
    print(f"{len(want)} SVGs checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
