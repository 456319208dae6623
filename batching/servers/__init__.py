"""Production servers driven from outside over their OpenAI-compatible API: ``replay`` sends
a workload at its arrival times and timestamps every streamed token, ``vllm_io`` exchanges
files with ``vllm bench serve``, ``served`` turns what a server returned into the package's
results file, and ``transformers_serve`` starts ``transformers serve`` on this CPU."""
