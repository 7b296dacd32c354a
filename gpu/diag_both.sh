B=$PWD/.gpu/bin; W=$(mktemp -d)
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
C10=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib","libc10_cuda.so"))')
sed -n "/^cat > \$W\/resnet.py <<'PY'/,/^PY/p" gpu/validate_truth.sh | sed '1d;$d' > $W/resnet.py
export PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4
timeout 150 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --lib $C10 --summary-json $W/agent.json --record $W/agent.rec --duration 120 > $W/agent.out 2>&1 & AG=$!
sleep 4
timeout 120 $B/gpufrag run --no-report --no-feed --summary-json $W/run.json --record $W/run.rec -- python3 $W/resnet.py $W/torch.json 12 > $W/run.out 2>&1
sleep 1; kill -INT $AG; wait $AG
cd $W && tar czf $OUT/both.tgz *.json *.rec *.out
