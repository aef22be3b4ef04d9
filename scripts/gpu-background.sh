#!/usr/bin/env bash
# A job longer than one device call (at most 10 minutes), run across two consecutive calls on the GPU machine.
# A process started with setsid outlives the call that started it while the machine stays held, and the machine
# is given back 30 s after a call ends: the second call must follow the first at once. Keep the first call's
# $OUT empty (run other sections in an earlier call): its files travel back after the command ends, likely inside
# those 30 s (a first call that also returned the GPU tests' files was followed by a fresh machine, the job lost).
#
#   call 1:  bash scripts/gpu-background.sh start NAME -- COMMAND ARGS...   (then `wait` in the same call)
#            bash scripts/gpu-background.sh wait NAME 560
#   call 2:  bash scripts/gpu-background.sh wait NAME 560 && cp /tmp/gpu-background/NAME/* "$OUT"/
#
# The job runs in /tmp/gpu-background/NAME (its working directory) with stdout and stderr in job.log; `start`
# copies nothing, so a command that reads a carried stage should copy what it needs there first (a later call
# replaces the carried folder). `wait` returns 0 when the job ended with status 0, 1 when it ended otherwise,
# 3 when it is still running after SECONDS, and prints the log's last lines and the elapsed seconds.
set -u
cmd=${1:?start | wait}
name=${2:?job name}
dir=/tmp/gpu-background/$name
case $cmd in
  start)
    shift 2
    [ "${1:-}" = "--" ] && shift
    [ $# -ge 1 ] || { echo "gpu-background: start $name: no command" >&2; exit 2; }
    if [ -f "$dir/start" ] && [ ! -f "$dir/end" ]; then
      echo "gpu-background: $name is already running (since $(cat "$dir/start"))" >&2
      exit 2
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    printf '%q ' "$@" > "$dir/command"
    date +%s > "$dir/start"
    (cd "$dir" && setsid nohup bash -c 'bash ./command > job.log 2>&1; echo $? > rc; date +%s > end' \
       > /dev/null 2>&1 < /dev/null &)
    echo "gpu-background: started $name in $dir"
    ;;
  wait)
    limit=${3:-560}
    [ -d "$dir" ] || { echo "gpu-background: no job $name" >&2; exit 2; }
    t0=$SECONDS
    while [ ! -f "$dir/end" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 2; done
    tail -c 1500 "$dir/job.log" | tr '\r' '\n' | tail -n 8
    now=$(date +%s)
    if [ -f "$dir/end" ]; then
      echo "gpu-background: $name ended with status $(cat "$dir/rc") after $(( $(cat "$dir/end") - $(cat "$dir/start") )) s"
      [ "$(cat "$dir/rc")" = 0 ]
      exit $?
    fi
    echo "gpu-background: $name still running after $(( now - $(cat "$dir/start" 2>/dev/null || echo "$now") )) s"
    exit 3
    ;;
  *)
    echo "gpu-background: unknown command '$cmd' (start | wait)" >&2
    exit 2
    ;;
esac
