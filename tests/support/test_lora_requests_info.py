"""The ``vllm:lora_requests_info`` parser against the llm-d router EPP's own test vectors.

Vectors taken from github.com/llm-d/llm-d-router at commit
ebab687927f5331c1b39defcb579a07951bce56c (2026-08-22), directory
``pkg/epp/framework/plugins/datalayer/extractor/metrics/``:

* ``spec_test.go`` ``TestGetLoRAMetric``: its three cases;
* ``extractor_test.go`` ``TestExtractorExtract`` "multiple valid metrics": the LoRA family;
* ``metrics_extraction_from_config_test.go`` ``TestMetricsExtractionDefaultConfig``: the LoRA
  series its mock server (``mock_server_test.go``, a ``prometheus.NewGaugeVec`` served by
  ``promhttp``) exposes, and ``TestMetricsExtractionLoRAFamilyAbsentNoError``.

The Go tests build ``dto.MetricFamily`` values (or serve them through promhttp); here each is
written as the Prometheus text exposition of the same series, which the EPP's metrics
source parses into those values. The last test reads what vLLM 0.32's
``PrometheusStatLogger`` writes (``set_to_current_time`` on a new series per change).
"""

from __future__ import annotations

import time

from tests.support.lora_requests_info import LoraRequestsInfo, parse_lora_requests_info

HEADER = "# TYPE vllm:lora_requests_info gauge\n"


def test_missing_family_treated_as_no_adapters() -> None:
    # spec_test.go: "missing family treated as no adapters" (expectedAdapters nil)
    exposition = "# TYPE some_other_metric gauge\nsome_other_metric 1.0 1000\n"
    assert parse_lora_requests_info(exposition) is None


def test_basic_lora_metrics_take_the_newest_series() -> None:
    # spec_test.go: "basic lora metrics": values 3000 (newer) and 1000 (older)
    exposition = (
        HEADER + 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="lora1"} 3000.0 1000\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="lora2,lora3"} 1000.0 1000\n'
    )
    info = parse_lora_requests_info(exposition)
    assert info == LoraRequestsInfo(running=frozenset({"lora1"}), waiting=frozenset(), max_lora=2)


def test_no_matching_lora_metrics_means_no_adapters() -> None:
    # spec_test.go: "no matching lora metrics": expectedAdapters {}, expectedMax 0
    exposition = HEADER + 'vllm:lora_requests_info{other_label="value"} 5.0 3000\n'
    info = parse_lora_requests_info(exposition)
    assert info == LoraRequestsInfo(running=frozenset(), waiting=frozenset(), max_lora=0)


def test_running_waiting_and_max_from_one_series() -> None:
    # extractor_test.go "multiple valid metrics": running lora1, waiting lora2, max_lora 1,
    # no gauge value set (0)
    exposition = HEADER + (
        'vllm:lora_requests_info{running_lora_adapters="lora1",'
        'waiting_lora_adapters="lora2",max_lora="1"} 0\n'
    )
    info = parse_lora_requests_info(exposition)
    assert info == LoraRequestsInfo(
        running=frozenset({"lora1"}), waiting=frozenset({"lora2"}), max_lora=1
    )


def test_default_config_series_as_the_mock_server_exposes_it() -> None:
    # metrics_extraction_from_config_test.go TestMetricsExtractionDefaultConfig: value
    # time.Now().Unix(); labels sorted by the GaugeVec; MaxActiveModels 4, ActiveModels
    # contain adapter-a and adapter-b, WaitingModels adapter-c
    now = float(int(time.time()))
    exposition = (
        "# HELP vllm:num_requests_waiting \n# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting 7\n" + HEADER + "vllm:lora_requests_info{"
        'max_lora="4",running_lora_adapters="adapter-a,adapter-b",'
        f'waiting_lora_adapters="adapter-c"}} {now}\n'
    )
    info = parse_lora_requests_info(exposition)
    assert info is not None
    assert info.max_lora == 4
    assert {"adapter-a", "adapter-b"} <= info.running
    assert "adapter-c" in info.waiting
    assert info.errors == ()


def test_lora_family_absent_is_not_an_error() -> None:
    # metrics_extraction_from_config_test.go TestMetricsExtractionLoRAFamilyAbsentNoError
    exposition = (
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 4\n"
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.2\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1\n'
    )
    assert parse_lora_requests_info(exposition) is None


def test_names_are_trimmed_empty_ones_dropped_and_a_bad_max_is_reported() -> None:
    # extractor.go addAdapters (TrimSpace, skip empty) and populateLoRAMetrics (an Atoi
    # error is collected, the lists still read)
    exposition = HEADER + (
        'vllm:lora_requests_info{running_lora_adapters=" a@v1 ,,b@v2",'
        'waiting_lora_adapters="",max_lora="x"} 5\n'
    )
    info = parse_lora_requests_info(exposition)
    assert info is not None
    assert info.running == {"a@v1", "b@v2"}
    assert info.waiting == frozenset()
    assert info.max_lora == 0
    assert info.errors


def test_spec_labels_select_among_series() -> None:
    # loraspec.go: getLatestMetric considers only the series matching the spec's labels
    exposition = HEADER + (
        'vllm:lora_requests_info{engine="0",running_lora_adapters="a",max_lora="2"} 9\n'
        'vllm:lora_requests_info{engine="1",running_lora_adapters="b",max_lora="2"} 5\n'
    )
    info = parse_lora_requests_info(exposition, labels={"engine": "1"})
    assert info is not None and info.running == {"b"}


def test_what_vllm_writes_newest_idle_series_wins() -> None:
    # vLLM 0.32 PrometheusStatLogger: each change of the lists is a new series set to the
    # current time; once the adapter is idle the newest series names nothing
    exposition = (
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n" + HEADER + "vllm:"
        'lora_requests_info{max_lora="2",running_lora_adapters="legal@v1",'
        'waiting_lora_adapters="legal@v1"} 1.7960966765850112e+09\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters=""} 1.7960966772151067e+09\n'
    )
    info = parse_lora_requests_info(exposition)
    assert info == LoraRequestsInfo(running=frozenset(), waiting=frozenset(), max_lora=2)
