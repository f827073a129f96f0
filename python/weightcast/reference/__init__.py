"""The torch reference engine: a tensor-parallel torch LM served over HTTP, updated through
weightcast.Receiver in every worker.

    python3 -m weightcast.reference --tp 2 --model tiny --port 0 --port-file /tmp/port

(`python -m weightcast.torch_engine`, its former name, still starts it.)

It is the working example of embedding weightcast in an engine: N worker processes (one per TP
rank) each hold only their shard in fused qkv_proj / gate_up_proj parameters, load HF-named full
tensors through ``load_weights`` (narrowed in place), and receive updates with their own
Receiver. This front process serves the control plane with weightcast's routes and field names
(docs/protocol.md), relaying each call to every worker, plus:

    POST /generate {"input_ids": [...], "sampling_params": {"max_new_tokens": n}}
        greedy decoding; answers {"output_ids", "meta_info": {"weight_version"}}
    GET  /spec_accept_length   the draft's speculative accept length (sync/model/spec_probe.h)

--api vllm serves vLLM's dev-mode weight-transfer routes instead of weightcast's (the ones a
vLLM server with the ``weightcast`` backend serves, answered in vLLM's shapes; weightcast-train
detects them from /server_info): /init_weight_transfer_engine {init_info},
/start_weight_update, /start_draft_weight_update, /update_weights {update_info},
/finish_weight_update {weight_version}, /pause?mode=, /resume, /reset_prefix_cache,
/get_world_size, /weight_info, /server_info (vllm_config). The bodies are read with the vLLM
plug-in's own parsers (weightcast.engine_rank.parse_init_info / parse_update_info).
--api sglang keeps the routes and answers /server_info in SGLang's shape (no "success"), with
the plug-in's announce in ``internal_states``. Every API adds a ``weightcast`` key to
/server_info (version, receiver, runners, whether our native routes are served), as the SGLang
plug-in adds it to SGLang's; under --api sglang and vllm sessions have no owners.

Deployed as weightcast-engine is (docs/security.md): --token makes every route but /health
need "Authorization: Bearer <token>", and without one the engine refuses to listen beyond
loopback; bodies over --max-body-bytes are refused before they are read (413), and a request that
does not arrive whole within --http-timeout-ms is dropped.

--debug-routes adds test hooks (/debug/save_params, /debug/fail_load, /debug/fail_bucket,
/debug/info).
Sessions are owned as in weightcast-engine: a begin that names a holder gets a session_id every
later call must carry. A bucket that fails on any worker aborts the session on all of them.

The modules, in the order a request meets them:

    main.py     the command line: parses it, builds the Engine, serves
    server.py   the HTTP front: reads a request, dispatches it from the route table, answers JSON
    guard.py    weightcast-engine's deployment guards: bearer token, body limit, bind refusal
    routes.py   the route tables of the three APIs (weightcast, sglang, vllm) and the test hooks
    info.py     /server_info in each API's shape
    engine.py   the front's state (pause, weight version) and the operations, relayed to workers
    session.py  the front's session (the bound C++ SessionMachine) and its idle watchdog
    workers.py  the worker processes and the RPC over their pipes
    worker.py   one TP worker process: its model shard and its weightcast.Receiver
    model.py    the torch model, loaded the way vLLM and SGLang load theirs
"""
