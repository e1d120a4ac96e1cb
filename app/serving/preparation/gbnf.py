"""GBNF grammars (llama.cpp's syntax, which ``structured_outputs.grammar`` accepts) converted to
Lark, llguidance's own syntax, once, in the gateway.

llguidance converts GBNF in Python, and finds the rules that are terminals (refer only to
terminals) by sweeping every rule until a sweep changes nothing: one sweep per link of the
longest chain, quadratic in a grammar's size. A 32 KB chain of rules costs seconds, and vLLM
converts every grammar twice, in the gateway's process (checking the request) and in the
engine core (compiling it), both times holding the interpreter lock that the event loop and
the engine's step loop need. Here the terminal rules are found in one pass over the rules,
with llguidance's parser and printer otherwise, and vLLM is handed Lark, which it passes
through unconverted.
"""

from __future__ import annotations

from collections import defaultdict

from llguidance.gbnf_to_lark import ASTNode, GrammarParser, RuleNode, RuleRefNode, resolve

ROOT = "root"


def gbnf_to_lark(text: str) -> str:
    """``text`` (GBNF) as Lark, as llguidance's ``gbnf_to_lark`` writes it, in time linear in
    the grammar. Raises what llguidance's converter raises for a grammar it cannot read."""
    rules = GrammarParser().parse(text)
    _mark_terminal_rules(rules)
    # What is left of llguidance's sweep finds nothing more: one pass, then it names rules.
    resolve(rules)
    lark = "%llguidance {}\n\n"
    after_newline = True
    for rule in sorted(rules.values(), key=lambda r: r.order):
        written = str(rule)
        if not after_newline and "\n" in written:
            lark += "\n"
        lark += written + "\n"
        after_newline = "\n" in written
        if after_newline:
            lark += "\n"
    return lark


def _mark_terminal_rules(rules: dict[str, RuleNode]) -> None:
    """Mark each rule that llguidance's sweep would call terminal: every rule it refers to is
    one, the root is none, and a cycle is none. Counted down from the rules each rule waits
    for, so each reference is looked at once."""
    waiting_on: dict[str, set[str]] = {name: _references(rule) for name, rule in rules.items()}
    waiters: dict[str, list[str]] = defaultdict(list)
    for name, references in waiting_on.items():
        for reference in references:
            waiters[reference].append(name)
    ready = [name for name, references in waiting_on.items() if not references]
    while ready:
        name = ready.pop()
        if name == ROOT or name not in rules:
            continue
        rules[name].rule_is_terminal = True
        for waiter in waiters[name]:
            waiting_on[waiter].discard(name)
            if not waiting_on[waiter]:
                ready.append(waiter)


def _references(rule: RuleNode) -> set[str]:
    """The names of the rules ``rule`` refers to, found without recursion."""
    names: set[str] = set()
    pending: list[ASTNode] = [rule.alternatives]
    while pending:
        node = pending.pop()
        if isinstance(node, RuleRefNode):
            names.add(node.name)
        pending.extend(node.children())
    return names
