"""What each agent may do and how much of it: the policy layer around the team.

A :class:`TeamPolicy` is a value: which tools and which direct handoffs each agent has, the
budgets that end a task gracefully instead of letting it run away, and what to do when two
agents bounce work back and forth. :func:`load_policy` reads one from a TOML file.
:func:`meet` caps a policy under the operator's (a :class:`PolicyCeiling`), key by key.
"""

from relaygraph.policies._ceiling import (
    Loosening,
    PolicyCeiling,
    loosenings,
    meet,
    policy_ceiling,
)
from relaygraph.policies._file import (
    load_policy,
    parse_policy,
    policy_to_mapping,
    read_policy_file,
    stored_policy,
)
from relaygraph.policies._policy import (
    LIMIT_NAMES,
    AgentLimits,
    AgentPolicy,
    FinalizePolicy,
    PingPongPolicy,
    Price,
    Roster,
    TeamLimits,
    TeamPolicy,
    default_policy,
)
from relaygraph.policies._tighten import tighten

__all__ = [
    "LIMIT_NAMES",
    "AgentLimits",
    "AgentPolicy",
    "FinalizePolicy",
    "Loosening",
    "PingPongPolicy",
    "PolicyCeiling",
    "Price",
    "Roster",
    "TeamLimits",
    "TeamPolicy",
    "default_policy",
    "load_policy",
    "loosenings",
    "meet",
    "parse_policy",
    "policy_ceiling",
    "policy_to_mapping",
    "read_policy_file",
    "stored_policy",
    "tighten",
]
