"""The refusal of an argument a tool does not take: it names the argument, the nearest valid one and all of them."""
from __future__ import annotations

import pytest

from hub.mcp.server import AmuxMCPServer, unknown_argument_refusal

TAKES = ("prompt", "profile", "permission_policy")

CASES = [
    # every argument known: no refusal
    ({"prompt": "x", "permission_policy": "deny-all"}, None),
    # one typo: the nearest valid name, then all of them
    ({"prompt": "x", "permision_policy": "deny-all"},
     "t has no argument 'permision_policy'; did you mean 'permission_policy'? It takes: prompt, profile, "
     "permission_policy"),
    # nothing near: only what it takes
    ({"colour": "red"}, "t has no argument 'colour'; it takes: prompt, profile, permission_policy"),
    # several: each named, with its suggestion where there is one
    ({"profil": "a", "colour": "red"},
     "t has no arguments 'profil' (did you mean 'profile'?), 'colour'; it takes: prompt, profile, permission_policy"),
]


@pytest.mark.parametrize("arguments,refusal", CASES)
def test_an_unknown_argument_is_refused_naming_it_the_nearest_and_all_the_tool_takes(arguments, refusal):
    assert unknown_argument_refusal("t", arguments, TAKES) == refusal


def test_a_tool_without_arguments_says_so():
    assert unknown_argument_refusal("t", {"x": 1}, ()) == "t has no argument 'x'; it takes: no arguments"


async def test_the_published_schema_is_closed_and_the_arguments_follow_a_tool_replaced_later():
    server = AmuxMCPServer("t")

    def f(a: int) -> int:
        """Use a."""
        return a

    server.add_tool(f)
    assert (await server.list_tools())[0].input_schema["additionalProperties"] is False
    assert await server.arguments_of("f") == ("a",)
    server.remove_tool("f")

    def g(b: int) -> int:
        """Use b."""
        return b

    server.add_tool(g, name="f")
    assert await server.arguments_of("f") == ("b",) and await server.arguments_of("missing") is None
