#!/bin/bash
# usage: run_vidur.sh <vllm|sarathi> <num_requests> <outdir> [predictor=random_forrest] [extra args...]
set -e
SCHED=$1; N=$2; OUT=$3; PRED=${4:-random_forrest}; shift 4 || shift $#
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
mkdir -p "$OUT"
if [ "$SCHED" = vllm ]; then
  SARGS="--replica_scheduler_config_type vllm --vllm_scheduler_config_batch_size_cap 128 --vllm_scheduler_config_max_tokens_in_batch 4096"
else
  SARGS="--replica_scheduler_config_type sarathi --sarathi_scheduler_config_batch_size_cap 128 --sarathi_scheduler_config_chunk_size 512"
fi
P=${PRED}_execution_time_predictor_config
exec "${VIDUR_PYTHON:-/tmp/vidur/venv/bin/python}" "$(dirname "$0")/vidur_patched.py" \
  --seed 0 \
  --cluster_config_num_replicas 1 \
  --replica_config_model_name meta-llama/Llama-2-70b-hf \
  --replica_config_device a100 --replica_config_network_device a100_pairwise_nvlink \
  --replica_config_tensor_parallel_size 2 --replica_config_num_pipeline_stages 1 \
  --global_scheduler_config_type round_robin $SARGS \
  --request_generator_config_type synthetic \
  --synthetic_request_generator_config_seed 0 \
  --synthetic_request_generator_config_num_requests $N \
  --length_generator_config_type fixed \
  --fixed_request_length_generator_config_seed 0 \
  --fixed_request_length_generator_config_prefill_tokens 2048 \
  --fixed_request_length_generator_config_decode_tokens 512 \
  --interval_generator_config_type poisson \
  --poisson_request_interval_generator_config_seed 0 \
  --poisson_request_interval_generator_config_qps 0.5 \
  --execution_time_predictor_config_type $PRED \
  --${P}_model_profiling_dataset local/a100-llama-2-70b-hf \
  --${P}_network_profiling_dataset local/a100-pairwise-nvlink \
  --${P}_cache_dir "${VIDUR_CACHE:-/tmp/vidur/cache}" \
  --${P}_prediction_max_tokens_per_request 4096 \
  --${P}_num_training_job_threads 1 \
  --no-metrics_config_enable_chrome_trace --no-metrics_config_store_plots \
  --no-metrics_config_write_json_trace --metrics_config_output_dir "$OUT" \
  "$@"
