"""What the built-in tools do, apart from how agents see them.

:mod:`relaygraph.agents.tools` defines the tools a model calls; the work happens here:
``sandbox`` runs Python isolated (its limits and result in ``_sandbox_limits``, the process
in ``_sandbox_process`` and ``_sandbox_child``, bubblewrap namespaces in ``_bubblewrap``, a
cgroup per run in ``_cgroup``), ``workspace`` reads and writes the task's files without
following anything sandboxed code planted (``_nofollow``; a replay's copy of one in
``_workspace_copy``), and ``kb`` is the knowledge base
the researcher searches (the files it reads in ``_kb_files``, their ids in ``_kb_ids``,
what it returns in ``_kb_documents``, its sample corpus in ``corpus/``). Nothing here imports
LangChain or LangGraph.
"""
