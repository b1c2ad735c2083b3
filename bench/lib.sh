# bench/lib.sh - what the benchmarks that train a random model share:
# sourced after they set $build (the build folder), $tmp (their scratch
# folder) and the model's shape.

# bench_llama DIR: DIR/config.json of an untied float32 Llama shaped by
# $hidden, $inter, $layers, $heads (as many key/value heads) and $vocab, for
# from_config runs (random initialisation, no weights file)
bench_llama () {
	mkdir -p "$1" && cat >"$1/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $hidden,
 "intermediate_size": $inter, "num_hidden_layers": $layers, "num_attention_heads": $heads,
 "num_key_value_heads": $heads, "vocab_size": $vocab, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "float32"}
JSON
}

# bench_ids PREFIX DOCS LEN: DOCS records of LEN random ids below $vocab
# (a fixed seed: the same ids every run), as the indexed dataset
# PREFIX.bin/PREFIX.idx (and their source, PREFIX.jsonl)
bench_ids () {
	awk -v V="$vocab" -v D="$2" -v n="$3" 'BEGIN { srand(7); for (d = 0; d < D; d++) { printf "{\"ids\":["
		for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", int(rand() * V); print "]}" } }' >"$1.jsonl" &&
	"$build/bin/hp-test-tool" mkidx --vocab "$vocab" --records-of "$3" -o "$1" "$1.jsonl" >/dev/null
}
