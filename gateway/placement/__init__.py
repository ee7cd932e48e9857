"""Link monitor + planner: which task of which service runs on the gateway and which in the cloud.

Math (``model``, ``search``, ``planner.plan_placement``) is pure; mechanism (``probe.LinkProber``,
``controller.PlacementController``) owns the asyncio tasks. See docs/placement.md.
"""

from gateway.placement.controller import PlacementController
from gateway.placement.cost import Budgets, LinkView
from gateway.placement.execution import PlannedSides, ServiceSides, service_sides
from gateway.placement.link import LinkEstimate, LinkMonitor
from gateway.placement.pins import PinError, check_pins
from gateway.placement.plan import Decision, Plan, ServicePlan
from gateway.placement.planner import Hysteresis, PlacementPlanner, plan_placement
from gateway.placement.probe import LinkProber

__all__ = [
    "Budgets",
    "Decision",
    "Hysteresis",
    "LinkEstimate",
    "LinkMonitor",
    "LinkProber",
    "LinkView",
    "PinError",
    "PlacementController",
    "PlacementPlanner",
    "Plan",
    "PlannedSides",
    "ServicePlan",
    "ServiceSides",
    "check_pins",
    "plan_placement",
    "service_sides",
]
