//! The pipeline's first stage with a real model: sentence-transformers/all-MiniLM-L6-v2 run
//! by OpenVINO on CPU behind OVMS's embeddings API (tests/embedder/server.py, the nearest
//! thing to OpenVINO Model Server that runs here: OVMS ships as an image no registry can
//! give these machines). loadgen embeds a real corpus through it in batches, meets its
//! refusals as clear errors that leave the vectors cache as it was, runs it live beside
//! ingestion in closed loop, and what was ingested through the proxy is found again by the
//! official Python client with a query the same model embedded.
//!
//! The one fault a real server cannot be made to show on demand, a stall mid-corpus, is the
//! stand-in's (`FakeOvms::stalling_after`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::*;
use serde_json::Value;

/// Six short documents on unrelated subjects, one chunk each at --chunk-chars 1000; read in
/// file-name order, so document i is chunk i in loadgen's payload.
const DOCUMENTS: [&str; 6] = [
    "Volcanoes form where molten rock from the Earth's mantle reaches the surface. Magma \
     chambers under the crust fill over centuries, and when the pressure builds, eruptions \
     throw ash, lava and gas into the air. Iceland and Hawaii sit on hot spots where lava \
     flows are frequent.",
    "To bake sourdough bread, feed a starter of flour and water for several days until it \
     bubbles. Mix it with more flour, water and salt, let the dough rise overnight, shape a \
     loaf and bake it in a hot oven until the crust is dark and crisp.",
    "TLS protects data in transit between a client and a server. During the handshake the \
     server proves its identity with a certificate signed by a trusted authority, and both \
     sides agree on session keys with an elliptic-curve key exchange before any application \
     data is encrypted.",
    "The football club won the championship final on penalties after a goalless draw. The \
     goalkeeper saved two spot kicks, and the captain lifted the trophy in front of forty \
     thousand supporters.",
    "Plants turn sunlight into chemical energy through photosynthesis. Chlorophyll in the \
     leaves absorbs light, and the plant combines carbon dioxide from the air with water \
     from the roots to make sugar, releasing oxygen.",
    "A fixed-rate mortgage keeps the same interest rate for the whole loan term, so monthly \
     repayments stay predictable. A variable-rate loan follows the central bank's base rate \
     and can become more expensive when rates rise.",
];

/// Questions a user would ask, each written from one document without copying it.
const QUERIES: [(&str, usize); 6] = [
    (
        "What makes a volcano erupt when pressure under the ground rises?",
        0,
    ),
    ("recipe for a crusty loaf made with a fermented starter", 1),
    (
        "How does a server prove who it is before an encrypted connection starts?",
        2,
    ),
    ("Which team won the cup after a penalty shootout?", 3),
    ("How do leaves make food from light?", 4),
    (
        "Will my home loan payments change if interest rates go up?",
        5,
    ),
];

fn write_corpus(dir: &Path) -> PathBuf {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    for (i, text) in DOCUMENTS.iter().enumerate() {
        std::fs::write(corpus.join(format!("doc{i}.txt")), text).unwrap();
    }
    corpus
}

/// `loadgen run`'s flags for the first stage live beside ingestion: `concurrency` calls of
/// 4 chunks in flight, the embedder's CPU watched.
fn live_embedding(embedder: &RealEmbedder, corpus: &Path, concurrency: usize) -> Vec<String> {
    args(&[
        "--embed-concurrency",
        &concurrency.to_string(),
        "--embed-batch",
        "4",
        "--embeddings-url",
        &embedder.url(),
        "--embeddings-model",
        REAL_MODEL,
        "--corpus",
        corpus.to_str().unwrap(),
        "--watch-pid",
        &format!("embedder={}", embedder.pid()),
    ])
}

/// `loadgen run` embedding `corpus` through `embeddings_url` into `cache`, each chunk
/// upserted once over gRPC through the proxy.
fn embed_args(
    s: &LoadgenStack,
    collection: &str,
    embeddings_url: &str,
    model: &str,
    corpus: &Path,
    cache: &Path,
) -> Vec<String> {
    let mut a = base_args(&format!("localhost:{}", s.grpc.addr.port()), collection);
    set_flag(&mut a, "--points-per-request", &DOCUMENTS.len().to_string());
    a.extend(args(&[
        "--vectors",
        "embeddings",
        "--embeddings-url",
        embeddings_url,
        "--embeddings-model",
        model,
        "--corpus",
        corpus.to_str().unwrap(),
        "--vectors-file",
        cache.to_str().unwrap(),
        "--embed-batch",
        "4",
        "--chunk-chars",
        "1000",
        "--requests",
        "1",
        "--recreate",
        "--protocol",
        "grpc",
    ]));
    a
}

/// The real model's server, the stack, and the corpus embedded through it (4 chunks a
/// call) into `collection`, each chunk upserted once through the gRPC proxy.
struct Ingested {
    embedder: RealEmbedder,
    stack: LoadgenStack,
    dir: PathBuf,
    corpus: PathBuf,
    cache: PathBuf,
    result: Value,
}

fn ingest(collection: &str) -> Ingested {
    let embedder = RealEmbedder::start(16);
    let stack = LoadgenStack::start();
    let dir = temp_dir(&format!("pipeline-{collection}"));
    let corpus = write_corpus(&dir);
    let cache = dir.join("vectors.bin");
    let run = run_loadgen(
        &embed_args(
            &stack,
            collection,
            &embedder.url(),
            REAL_MODEL,
            &corpus,
            &cache,
        ),
        Some(&dir.join("ingest.json")),
    );
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    Ingested {
        embedder,
        stack,
        dir,
        corpus,
        cache,
        result: run.result.expect("result"),
    }
}

#[test]
fn a_real_model_embeds_the_corpus_in_batches_into_vectors_that_mean_something() {
    let Ingested {
        embedder,
        corpus,
        cache,
        result: r,
        ..
    } = ingest("rag");
    assert_eq!(
        num(&r, &["workload", "dim"]),
        REAL_MODEL_DIM as f64,
        "the dimension is the model's"
    );
    let source = r["workload"]["vectors_source"].as_str().unwrap();
    assert!(
        source.contains("embeddings(")
            && source.contains(REAL_MODEL)
            && source.contains("6 chunks"),
        "{source}"
    );
    assert_eq!(r["verification"]["value"]["matches"], true, "{r:#}");

    // The cache holds the model's own answers, in corpus order: the vectors direct calls
    // give for the same chunks in the same batches of 4 (bit for bit but for the JSON's
    // decimal round trip), and within float noise of one call of all six (a batch pads
    // its texts to its longest, which changes the arithmetic, not the meaning).
    let (cached, _) = loadgen::vectors::read_vectors_file(&cache).unwrap();
    assert_eq!(
        (cached.len(), cached.dim),
        (DOCUMENTS.len(), REAL_MODEL_DIM)
    );
    let chunks = loadgen::vectors::chunk_corpus(&corpus, 1000).unwrap();
    let texts: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let same_batches: Vec<Vec<f32>> = texts.chunks(4).flat_map(|b| embedder.embed(b)).collect();
    let one_batch = embedder.embed(&texts);
    for i in 0..texts.len() {
        let worst = cached
            .row(i)
            .iter()
            .zip(&same_batches[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "chunk {i}: cached vector differs by {worst}");
        let norm: f32 = cached.row(i).iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3, "normalised as OVMS does: {norm}");
        let agreement = cosine(cached.row(i), &one_batch[i]);
        assert!(
            agreement > 0.9999,
            "chunk {i}: cosine {agreement} to one batch of all"
        );
    }

    // A real model, not a hash of the text: paraphrases close, unrelated text far. (The
    // 0.641 was measured with the same model exported by optimum-intel.)
    let v = embedder.embed(&[
        "The cat sits on the mat.",
        "A kitten is resting on a rug.",
        "Quarterly revenue grew by ten percent.",
    ]);
    let near = cosine(&v[0], &v[1]);
    let far = cosine(&v[0], &v[2]);
    println!("cosine: paraphrase {near:.3}, unrelated {far:.3}");
    assert!((near - 0.641).abs() < 0.01, "paraphrase cosine {near}");
    assert!(far.abs() < 0.1, "unrelated cosine {far}");
}

#[test]
fn the_real_servers_refusals_and_a_stall_are_clear_errors_that_leave_the_cache_as_it_was() {
    let embedder = RealEmbedder::start(16);
    let s = LoadgenStack::start();
    let dir = temp_dir("pipeline-refusals");
    let corpus = write_corpus(&dir);

    // The server's own answers, as OVMS gives them.
    let (status, answer) = embedder.call("no-such-model", &["text"]);
    assert_eq!(status, 404, "{answer}");
    assert_eq!(
        answer["error"],
        "Mediapipe graph definition with requested name is not found"
    );
    let (status, answer) = embedder.call(REAL_MODEL, &[]);
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = embedder.call(REAL_MODEL, &["x"; 17]);
    assert_eq!(status, 400, "{answer}");
    let long = "word ".repeat(600);
    let (status, answer) = embedder.call(REAL_MODEL, &[long.as_str()]);
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]
        .as_str()
        .unwrap()
        .ends_with("longer than allowed 512"));

    // A cache made earlier for other inputs: a failed run must leave it whole.
    let cache = dir.join("vectors.bin");
    let earlier = loadgen::vectors::synthetic(3, 8, 1);
    loadgen::vectors::write_vectors_file(&cache, &earlier, "model=earlier").unwrap();
    let before = std::fs::read(&cache).unwrap();
    let untouched = |what: &str| {
        assert_eq!(
            std::fs::read(&cache).unwrap(),
            before,
            "{what}: cache changed"
        );
        assert!(
            !cache.with_extension("partial").exists(),
            "{what}: a partial cache was left"
        );
    };

    let run = run_loadgen(
        &embed_args(
            &s,
            "refused",
            &embedder.url(),
            "no-such-model",
            &corpus,
            &cache,
        ),
        None,
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("HTTP 404")
            && run
                .stderr
                .contains("Mediapipe graph definition with requested name is not found"),
        "{}",
        run.stderr
    );
    untouched("unknown model");

    // More texts a call than the server takes: 18 chunks of about 100 characters, 32 a call.
    let mut too_big = embed_args(&s, "refused", &embedder.url(), REAL_MODEL, &corpus, &cache);
    set_flag(&mut too_big, "--chunk-chars", "100");
    set_flag(&mut too_big, "--embed-batch", "32");
    let run = run_loadgen(&too_big, None);
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("HTTP 400") && run.stderr.contains("limit of 16"),
        "{}",
        run.stderr
    );
    untouched("batch too large");

    // A server that answers the first call, then stalls: the run stops at --embed-timeout
    // with an error that says so, having cached nothing.
    let stalling = FakeOvms::stalling_after(48, 1);
    let mut stalled = embed_args(&s, "stalled", &stalling.url(), REAL_MODEL, &corpus, &cache);
    set_flag(&mut stalled, "--embed-batch", "2");
    stalled.extend(args(&["--embed-timeout", "2s"]));
    let started = Instant::now();
    let run = run_loadgen(&stalled, None);
    assert!(!run.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the stall is bounded by --embed-timeout"
    );
    assert!(
        run.stderr.contains(&stalling.url()) && run.stderr.contains("no answer within 2s"),
        "{}",
        run.stderr
    );
    assert_eq!(stalling.calls(), 1, "one answered call before the stall");
    untouched("stalled server");
}

#[test]
fn the_first_stage_runs_live_beside_ingestion_in_closed_loop() {
    let Ingested {
        embedder,
        stack: s,
        dir,
        corpus,
        cache,
        ..
    } = ingest("live");

    // Ingestion fed from the cache, the embedder kept busy beside it: 2 calls of 4 texts in
    // flight, for 1 s of warm-up and 4 s measured.
    let mut live = base_args(&format!("localhost:{}", s.grpc.addr.port()), "live");
    live.retain(|a| a != "--quiet");
    set_flag(&mut live, "--warmup", "1s");
    live.extend(args(&[
        "--vectors",
        "file",
        "--vectors-file",
        cache.to_str().unwrap(),
        "--protocol",
        "grpc",
        "--duration",
        "4s",
    ]));
    live.extend(live_embedding(&embedder, &corpus, 2));
    let run = run_loadgen(&live, Some(&dir.join("live.json")));
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let r = run.result.unwrap();
    assert!(num(&r, &["requests_ok"]) > 0.0, "ingestion ran");
    let e = &r["embed_live"];
    println!("{e:#}");
    assert_eq!(e["mode"], "closed-loop");
    assert_eq!(num(e, &["concurrency"]), 2.0);
    assert_eq!(num(e, &["failed"]), 0.0, "{e}");
    let ok = num(e, &["ok"]);
    assert!(ok >= 1.0, "{e}");
    assert_eq!(num(e, &["embeddings"]), ok * 4.0, "4 texts a call");
    // Counted over the measured phase only, not the warm-up.
    let measured = num(&r, &["measured_seconds"]);
    assert!(
        (num(e, &["seconds"]) - measured).abs() < 1.0,
        "embedding counted over {} s, the measured phase was {measured} s",
        num(e, &["seconds"])
    );
    let rate = num(e, &["embeddings_per_second"]);
    assert!((rate - ok * 4.0 / num(e, &["seconds"])).abs() < 1e-6);
    assert!(num(e, &["latency_ms", "p50"]) > 0.0);
    let embedder_cpu = r["cpu"]["watched"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "embedder")
        .expect("the embedder's CPU is watched");
    assert!(num(embedder_cpu, &["cpu_seconds"]) > 0.0, "{embedder_cpu}");
    assert!(
        run.stdout
            .contains("co-located embeddings (closed loop, 2 in flight"),
        "{}",
        run.stdout
    );
}

#[test]
fn what_was_ingested_through_the_proxy_is_found_by_a_query_the_same_model_embedded() {
    let Ingested {
        embedder,
        stack: s,
        dir,
        ..
    } = ingest("retrieval");

    let queries: Vec<Value> = QUERIES
        .iter()
        .map(|(query, chunk)| serde_json::json!({"query": query, "chunk": chunk}))
        .collect();
    let queries_file = dir.join("queries.json");
    std::fs::write(&queries_file, serde_json::to_vec(&queries).unwrap()).unwrap();
    let python = interop_python("qdrant-client");
    for prefer_grpc in [false, true] {
        let out = dir.join(format!("retrieve-{prefer_grpc}.txt"));
        let file = std::fs::File::create(&out).unwrap();
        let mut cmd = Command::new(&python);
        cmd.arg(repo_root().join("tests/embedder/retrieve.py"))
            .args(["--embeddings-url", &embedder.url(), "--model", REAL_MODEL])
            .args(["--host", "localhost"])
            .args(["--rest-port", &s.rest.addr.port().to_string()])
            .args(["--grpc-port", &s.grpc.addr.port().to_string()])
            .args(["--ca", certs().ca_cert.to_str().unwrap()])
            .args(["--collection", "retrieval"])
            .arg("--queries")
            .arg(&queries_file)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        if prefer_grpc {
            cmd.arg("--prefer-grpc");
        }
        let mut child = cmd.spawn().expect("retrieve.py");
        let status = wait_bounded(&mut child, Duration::from_secs(180), "retrieve.py");
        let text = std::fs::read_to_string(&out).unwrap();
        println!("--- {}\n{text}", if prefer_grpc { "gRPC" } else { "REST" });
        assert!(status.success(), "{text}");
        assert!(
            text.lines()
                .last()
                .is_some_and(|l| l == format!("{} passed, 0 failed", QUERIES.len())),
            "{text}"
        );
    }
}

/// `loadgen compare` with the first stage live in every cell: the report shows, per provider
/// and algorithm, what the co-located embedding load achieved.
#[test]
fn compare_reports_what_each_provider_left_to_the_co_located_embedder() {
    let embedder = RealEmbedder::start(16);
    let dir = temp_dir("pipeline-compare");
    let corpus = write_corpus(&dir);
    let out = dir.join("compare");
    let mut compare = args(&[
        "compare",
        "--providers",
        "ring,aws-lc-rs",
        "--algorithms",
        "ecdsa-p256",
        "--out",
        out.to_str().unwrap(),
        "--duration",
        "3s",
        "--warmup",
        "1s",
        "--concurrency",
        "2",
        "--proxy-bin",
        binary("proxy").to_str().unwrap(),
        "--upstream-bin",
        binary("embedded-qdrant").to_str().unwrap(),
        "--",
        "--dim",
        "32",
        "--points-per-request",
        "10",
        "--power",
        "none",
    ]);
    compare.extend(live_embedding(&embedder, &corpus, 1));
    let run = run_loadgen(&compare, None);
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let csv = std::fs::read_to_string(out.join("report.csv")).unwrap();
    for provider in ["ring", "aws-lc-rs"] {
        for metric in [
            "embeddings_per_second",
            "embedding_latency_p50_ms",
            "embedder_cpu_percent",
        ] {
            let row = csv
                .lines()
                .find(|l| l.starts_with(&format!("{provider},ecdsa-p256,{metric},")))
                .unwrap_or_else(|| panic!("{provider} {metric} in\n{csv}"));
            let median: f64 = row.split(',').nth(4).unwrap().parse().unwrap_or(0.0);
            assert!(median > 0.0, "{row}");
        }
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("Co-located embeddings (embeddings/s)") && md.contains("Co-located embedding"),
        "{md}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("chart-embeddings_per_second"));
}
