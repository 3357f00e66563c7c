"""The phone agent: a model operating an Android phone through its accessibility tree.

``ui_tree`` reads uiautomator dumps, ``device`` / ``simulator`` / ``phone``
are the phones (real over adb, or the simulated demo phone), ``actions`` and
``executor`` are the tools the model calls, ``tool_parse`` recovers calls
from replies, ``loop`` runs an episode against an OpenAI-compatible server,
``tasks`` and ``suite`` score episodes, ``expert`` is a scripted player that
solves every task (the training data of the demo model). See docs/agent.md.
"""
