#!/usr/bin/env python3
"""A test fixture: a real sentence-embedding model run by OpenVINO on CPU, behind the HTTP
API of OpenVINO Model Server's embeddings endpoint. OVMS itself ships as a container image,
which these machines cannot pull; its runtime (openvino, openvino-genai, the tokenizer as
OpenVINO models) comes from PyPI, so what runs here is the same inference OVMS runs, with
this thin HTTP layer in front instead of OVMS's.

What it answers, as OVMS does (src/embeddings/embeddings_api.cpp and the calculator, 2025):
  POST /v3/embeddings, /v3/v1/embeddings
        {"model", "input": str | [str], "encoding_format": "float" | "base64"}
     -> {"object": "list", "data": [{"object": "embedding", "embedding", "index"}],
         "usage": {"prompt_tokens", "total_tokens"}}   (plus "model", as OpenAI answers)
  errors, {"error": text} with OVMS's texts where its source gives them:
     404 "Mediapipe graph definition with requested name is not found" (unknown model),
     400 "input field is required", "input should be string, array of strings or array of
         integers", "every element in input array should be either string or int",
         "input must be homogeneous", "encoding_format should either base64 or float",
         "Input length N longer than allowed M" (tokens past max_position_embeddings),
     400 for an empty input list and for a batch past --max-batch: OVMS's own texts for
         these are not in its source (the first fails inside the tokenizer; the second is a
         deployment limit, like a proxy's body limit), so these two texts are this fixture's.
     Token-id inputs (arrays of ints), which OVMS accepts, are refused here with 400.
  GET /v2/health/live, /v2/health/ready: 200 once the model is compiled (OVMS's KServe
      health endpoints).

Inference runs one batch at a time (OpenVINO spreads each over the cores), as one OVMS
infer request would; HTTP requests are served on threads, so a slow client holds nothing.

Usage: server.py --model-dir IR_DIR --model-name NAME [--port 0] [--max-batch 256]
               [--pooling MEAN|CLS|LAST]
It also takes OVMS's own flags, so that it runs under a compose file written for OVMS's
image: --rest_port (the port), --source_model (the name clients send), --pooling, and
--model_repository_path and --task (accepted; the model is the one in --model-dir).
On start it prints one line, "listening on HOST:PORT", then serves until SIGTERM.
"""

import argparse
import base64
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import openvino_genai as genai

NOT_FOUND = "Mediapipe graph definition with requested name is not found"


class Refused(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


class Embedder:
    """The model and its tokenizer, compiled once; `embed` is serialised by a lock."""

    POOLING = {
        "MEAN": genai.TextEmbeddingPipeline.PoolingType.MEAN,
        "CLS": genai.TextEmbeddingPipeline.PoolingType.CLS,
        "LAST": genai.TextEmbeddingPipeline.PoolingType.LAST_TOKEN,
    }

    def __init__(self, model_dir, max_batch, pooling="MEAN"):
        config = genai.TextEmbeddingPipeline.Config()
        config.pooling_type = self.POOLING[pooling]
        config.normalize = True
        self.pipeline = genai.TextEmbeddingPipeline(model_dir, "CPU", config)
        self.tokenizer = genai.Tokenizer(model_dir)
        with open(f"{model_dir}/config.json") as f:
            model_config = json.load(f)
        # OVMS reads the longest input from max_position_embeddings (or max_trained_positions).
        self.max_tokens = int(model_config.get("max_position_embeddings")
                              or model_config.get("max_trained_positions") or 1024)
        self.max_batch = max_batch
        self.lock = threading.Lock()

    def embed(self, texts):
        if len(texts) > self.max_batch:
            raise Refused(400, f"batch of {len(texts)} inputs exceeds this server's limit of {self.max_batch}")
        with self.lock:
            tokens = self.tokenizer.encode(texts)
            length = tokens.input_ids.get_shape()[1]
            if length > self.max_tokens:
                raise Refused(400, f"Input length {length} longer than allowed {self.max_tokens}")
            prompt_tokens = int(np.asarray(tokens.attention_mask.data).sum())
            vectors = np.asarray(self.pipeline.embed_documents(texts), dtype=np.float32)
        return vectors, prompt_tokens


def parse_request(body):
    """OVMS's request parsing (EmbeddingsRequest::fromJson), its texts kept."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "Non-json request received in embeddings calculator")
    if not isinstance(doc, dict):
        raise Refused(400, "Received json is not an object")
    model = doc.get("model")
    if not isinstance(model, str):
        raise Refused(400, "model field is missing in JSON body")
    if "input" not in doc:
        raise Refused(400, "input field is required")
    raw = doc["input"]
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list):
        kinds = set()
        for item in raw:
            if isinstance(item, str):
                kinds.add("str")
            elif isinstance(item, bool) or not isinstance(item, (int, list)):
                raise Refused(400, "every element in input array should be either string or int")
            else:
                kinds.add("tokens")
        if len(kinds) > 1:
            raise Refused(400, "input must be homogeneous")
        if "tokens" in kinds:
            raise Refused(400, "token-id input is not served by this test server")
        if not raw:
            raise Refused(400, "input array should not be empty")
        texts = raw
    else:
        raise Refused(400, "input should be string, array of strings or array of integers")
    encoding = doc.get("encoding_format", "float")
    if not isinstance(encoding, str):
        raise Refused(400, "encoding_format should be string")
    if encoding not in ("float", "base64"):
        raise Refused(400, "encoding_format should either base64 or float")
    return model, texts, encoding


def make_handler(embedder, model_name):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as OVMS's HTTP server

        def log_message(self, fmt, *args):  # quiet: the tests read stdout for the port
            pass

        def answer(self, status, payload):
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path in ("/v2/health/live", "/v2/health/ready"):
                self.answer(200, b"")
            else:
                self.answer(404, {"error": "Invalid request URL"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path not in ("/v3/embeddings", "/v3/v1/embeddings"):
                self.answer(404, {"error": "Invalid request URL"})
                return
            try:
                model, texts, encoding = parse_request(body)
                if model != model_name:
                    raise Refused(404, NOT_FOUND)
                vectors, prompt_tokens = embedder.embed(texts)
            except Refused as refused:
                self.answer(refused.status, {"error": refused.text})
                return
            data = []
            for index, vector in enumerate(vectors):
                if encoding == "base64":
                    embedding = base64.b64encode(vector.astype("<f4").tobytes()).decode()
                else:
                    embedding = vector.tolist()
                data.append({"object": "embedding", "embedding": embedding, "index": index})
            self.answer(200, {
                "object": "list",
                "data": data,
                "model": model_name,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            })

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="OpenVINO IR directory (convert.py's output)")
    parser.add_argument("--model-name", "--source_model", dest="model_name", required=True,
                        help="the name clients send as \"model\"")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", "--rest_port", dest="port", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--pooling", choices=sorted(Embedder.POOLING), default="MEAN",
                        help="MEAN for sentence-transformers models; OVMS's LAST is Qwen3-Embedding's")
    parser.add_argument("--model_repository_path", help="OVMS's; accepted and unused")
    parser.add_argument("--task", choices=["embeddings"], help="OVMS's; only embeddings is served")
    args = parser.parse_args()

    embedder = Embedder(args.model_dir, args.max_batch, args.pooling)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(embedder, args.model_name))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    host, port = server.server_address[:2]
    print(f"listening on {host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
