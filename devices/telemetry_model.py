"""What a simulated field sensor measures: pure functions of (device, time, random stream).

Invariant: readings depend only on the device's seeded random stream and the simulated time,
so the same seed reproduces the same values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DAY_S = 86_400.0


@dataclass
class SensorState:
    """One device's slowly varying state (its own climate offsets and soil water)."""

    rng: random.Random
    temp_offset: float
    humidity_offset: float
    soil: float
    fault_left: int = 0
    dropout_left: int = 0
    faults: int = 0


def new_sensor(seed: int, index: int) -> SensorState:
    rng = random.Random(seed * 1_000_003 + index)
    return SensorState(
        rng=rng, temp_offset=rng.uniform(-2, 2), humidity_offset=rng.uniform(-5, 5), soil=rng.uniform(25, 45)
    )


def readings(state: SensorState, sim_time: float) -> tuple[dict[str, float | None], str]:
    """One sample: a daily temperature cycle peaking mid-afternoon, humidity moving against it,
    soil moisture drying slowly with occasional watering, Gaussian noise, and stuck or dead
    sensors now and then (reported as status "fault" with the dead reading as null)."""
    rng = state.rng
    phase = 2 * math.pi * ((sim_time % DAY_S) / DAY_S - 0.375)
    temperature = 18.0 + state.temp_offset + 7.0 * math.sin(phase) + rng.gauss(0, 0.3)
    humidity = min(100.0, max(5.0, 60.0 + state.humidity_offset - 18.0 * math.sin(phase) + rng.gauss(0, 1.5)))
    state.soil = max(5.0, state.soil - 0.002 + rng.gauss(0, 0.05))
    if rng.random() < 0.002:
        state.soil = min(60.0, state.soil + rng.uniform(10, 20))  # irrigation
    values: dict[str, float | None] = {
        "temperature_c": round(temperature, 2),
        "humidity_pct": round(humidity, 2),
        "soil_moisture_pct": round(state.soil, 2),
    }
    if state.fault_left == 0 and rng.random() < 0.005:
        state.fault_left = rng.randint(1, 20)
        state.faults += 1
    if state.fault_left:
        state.fault_left -= 1
        values[rng.choice(list(values))] = None
        return values, "fault"
    return values, "ok"


def silent(state: SensorState, dropout_probability: float) -> bool:
    """Whether the device skips this sample: a dropout lasts a few to a few dozen samples."""
    if state.dropout_left == 0 and dropout_probability and state.rng.random() < dropout_probability:
        state.dropout_left = state.rng.randint(3, 30)
    if state.dropout_left:
        state.dropout_left -= 1
        return True
    return False
