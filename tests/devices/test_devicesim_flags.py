"""devicesim refuses a numeric flag out of its range as a usage error (exit 2, one line naming the
flag), before anything runs: ``--fps 0`` used to send the camera's scene planner into an endless
loop that ate the machine's memory. Parsed only, never run, so a regression cannot do that here."""

from __future__ import annotations

import argparse

import pytest

from devices.cli import build_parser


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line devicesim's parser prints for ``argv`` (it must exit 2)."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["camera", "--fps", "0"], "argument --fps: must be from 1 to 120, not 0"),
        (["camera", "--fps", "-5"], "argument --fps: must be from 1 to 120, not -5"),
        (["camera", "--fps", "0.5"], "argument --fps: must be from 1 to 120, not 0.5"),
        (["camera", "--fps", "nan"], "argument --fps: must be a finite number, not nan"),
        (["camera", "--fps", "fast"], "argument --fps: 'fast' is not a number"),
        (["camera", "--width", "0"], "argument --width: must be from 32 to 4096, not 0"),
        (["camera", "--height", "-240"], "argument --height: must be from 32 to 4096, not -240"),
        (["camera", "--frames", "-1"], "argument --frames: must be at least 0, not -1"),
        (["camera", "--noise", "-3"], "argument --noise: must be from 0 to 255, not -3"),
        (["camera", "--port", "0"], "argument --port: must be from 1 to 65535, not 0"),
        (["camera", "--port", "99999"], "argument --port: must be from 1 to 65535, not 99999"),
        (["camera", "--jpeg-quality", "0"], "argument --jpeg-quality: must be from 1 to 100, not 0"),
        (["camera", "--seed", "1.5"], "argument --seed: '1.5' is not an integer"),
        (["sensors", "--rate", "0"], "argument --rate: must be more than 0, not 0"),
        (["sensors", "--rate", "-1"], "argument --rate: must be more than 0, not -1"),
        (["sensors", "--count", "0"], "argument --count: must be at least 1, not 0"),
        (["sensors", "--duration", "-1"], "argument --duration: must be at least 0, not -1"),
        (["sensors", "--messages", "0"], "argument --messages: must be at least 1, not 0"),
        (["sensors", "--dropout", "1.5"], "argument --dropout: must be from 0 to 1, not 1.5"),
        (["sensors", "--password-file", "/no/such/file"], "argument --password-file: cannot read"),
    ],
)
def test_out_of_range_flag_is_a_usage_error(argv, says, capsys):
    line = refusal(argv, capsys)
    assert line.startswith(f"devicesim {argv[0]}: error: {says}"), line


def test_the_defaults_and_the_edges_of_each_range_parse():
    parser = build_parser()
    camera = parser.parse_args(["camera", "--fps", "1", "--width", "32", "--port", "65535", "--frames", "0"])
    assert (camera.fps, camera.width, camera.port, camera.frames) == (1.0, 32, 65535, 0)
    sensors = parser.parse_args(["sensors", "--rate", "0.01", "--dropout", "0", "--duration", "0"])
    assert (sensors.rate, sensors.dropout, sensors.duration, sensors.count) == (0.01, 0.0, 0.0, 3)


def test_every_numeric_flag_has_a_range():
    """A numeric flag added with plain ``int`` or ``float`` would take 0 and negatives unchecked."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    numeric_default = (int, float)
    unchecked = [
        f"{name} {action.option_strings[0]}"
        for name, command in commands.choices.items()
        for action in command._actions
        if action.type in numeric_default
        or (action.type is None and type(action.default) in numeric_default)  # bool is not numeric here
    ]
    assert not unchecked, f"numeric flags without a range: {unchecked}"
