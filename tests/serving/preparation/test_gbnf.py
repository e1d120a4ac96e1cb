"""GBNF converted to Lark in the gateway: what llguidance's own converter writes, for grammars
written by hand and drawn at random (cycles, the root referred to, rules never used), in time
linear in the grammar where llguidance's is quadratic in its longest chain of rules."""

from __future__ import annotations

import random

import pytest
from llguidance.gbnf_to_lark import ASTNode
from llguidance.gbnf_to_lark import gbnf_to_lark as llguidance_converter

from app.serving.preparation.gbnf import gbnf_to_lark

JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}"""

BY_HAND = [
    JSON_GBNF,
    'root ::= (expr "=" ws term "\\n")+\nexpr ::= term ([-+*/] term)*\n'
    'term ::= ident | num | "(" ws expr ")" ws\nident ::= [a-z] [a-z0-9_]* ws\n'
    "num ::= [0-9]+ ws\nws ::= [ \\t\\n]*",
    'root ::= item+\n# a comment\nitem ::= "- " [^\\r\\n]+ "\\n"',
    'root ::= a\na ::= b | "x"\nb ::= a "y"',  # a cycle: neither is a terminal
    'root ::= a root | "z"\na ::= "q"',  # the root is never a terminal
    'root ::= "yes" | "no"',
]


def chain(rules: int) -> str:
    """Each rule refers to the next; only the last is a terminal by itself."""
    body = "\n".join(f'r{i} ::= "a" r{i + 1}' for i in range(rules))
    return f'root ::= r0\n{body}\nr{rules} ::= "x"'


def random_grammar(rng: random.Random) -> str:
    count = rng.randint(1, 8)
    leaves = ['"a"', "[b-d]", '"e"*', '("f" | "g")', "root"]
    rules = []
    for number in range(count):
        alternatives = []
        for _ in range(rng.randint(1, 3)):
            items = [
                f"r{rng.randrange(count)}" if rng.random() < 0.4 else rng.choice(leaves)
                for _ in range(rng.randint(1, 3))
            ]
            alternatives.append(" ".join(items))
        rules.append(f"r{number} ::= " + " | ".join(alternatives))
    return "root ::= r0\n" + "\n".join(rules)


@pytest.mark.parametrize(
    "grammar",
    BY_HAND + [chain(50)] + [random_grammar(random.Random(seed)) for seed in range(200)],
)
def test_the_lark_is_llguidances(grammar: str) -> None:
    assert gbnf_to_lark(grammar) == llguidance_converter(grammar)


@pytest.mark.parametrize("grammar", ["root ::= missing", 'root ::= ("a"', 'a ::= "x"'])
def test_a_grammar_llguidance_cannot_read_raises_as_it_does(grammar: str) -> None:
    with pytest.raises(Exception) as theirs:
        llguidance_converter(grammar)
    with pytest.raises(type(theirs.value)) as ours:
        gbnf_to_lark(grammar)
    assert str(ours.value) == str(theirs.value)


def test_a_chain_of_rules_costs_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in terminal checks: the work llguidance's sweep grows with."""
    checks = 0
    is_terminal = ASTNode.is_terminal

    def counted(node: ASTNode) -> bool:
        nonlocal checks
        checks += 1
        return is_terminal(node)

    monkeypatch.setattr(ASTNode, "is_terminal", counted)
    work = {}
    for rules in (200, 400):
        for name, convert in (("ours", gbnf_to_lark), ("llguidance", llguidance_converter)):
            checks = 0
            convert(chain(rules))
            work[name, rules] = checks
    assert work["ours", 400] <= 2.2 * work["ours", 200]  # linear
    assert work["llguidance", 400] >= 3.5 * work["llguidance", 200]  # quadratic
    assert work["ours", 400] * 50 < work["llguidance", 400]
