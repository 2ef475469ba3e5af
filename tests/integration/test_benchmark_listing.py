"""benchmarks/job_listing.py prints every figure as a `name: value unit` line, on a coordinator whose
listing leaves ended jobs out (a reply of 1020 jobs of 1220), and how much memory an ended job takes."""

from .bench_kit import run_benchmark


def test_job_listing_benchmark_prints_every_figure():
    stdout, figures = run_benchmark("job_listing.py", "--quick", "--jobs", "1200", "--repeat", "1")
    want = ["listing_ended_jobs", "listing_default_median", "listing_status_cli_median", "listing_user_filter_median",
            "listing_all_median", "listing_user_filter_vs_all",
            "listing_default_vs_all", "listing_status_cli_vs_all", "health_p99_idle",
            "health_p99_while_listing_default", "health_p99_while_listing_all", "health_p99_listing_default_vs_all",
            "listing_all_paged_median", "listing_all_paged_vs_all", "health_p99_while_listing_all_paged",
            "health_p99_listing_all_paged_vs_all"] + [f"{n}_{k}" for n in ("metrics", "users", "projects")
                                                      for k in ("median", "fresh_median", "vs_fresh")]
    want += ["memory_per_ended_job", "memory_per_ended_job_after_restart", "restart_seconds", "record_bytes_packed",
             "record_bytes_unpacked", "record_packed_vs_unpacked"]
    assert not [w for w in want if w not in figures], stdout
    assert int(figures["listing_ended_jobs"]) == 1200
    assert 0 < float(figures["record_bytes_packed"]) < float(figures["record_bytes_unpacked"])
