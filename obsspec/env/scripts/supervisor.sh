# obsspec sandbox supervisor: PID 1 of an episode's PID namespace (bwrap --as-pid-1).
#
# Protocol, on stdin, one request per command:   OP NONCE NBYTES ARG\n<NBYTES bytes of script>
#   OP=run  : an agent command, run with the episode's persistent shell state (runner.sh);
#             ARG is the logical clock for this turn (epoch seconds) that the command sees.
#   OP=raw  : a harness script (setup, verifier), run in a fresh bash with cwd = workdir.
# Everything the script prints (stdout and stderr merged) goes to our stdout, followed by the
# end marker \0NONCE RC\0. The harness reads until the marker, so no output is ever lost to a
# race, and a command cannot forge the marker without knowing the nonce.
#
# Being PID 1, this shell survives `kill -9 -1` from inside the sandbox. On SIGUSR1 (sent by the
# harness when a command exceeds its timeout) it kills every other process in the namespace.
# On exit the kernel kills everything left in the namespace: nothing outlives an episode.

agent_lc_all=$LC_ALL
export LC_ALL=C   # read -N counts bytes; commands get the agent's locale back
exec 2>/dev/null
ulimit -u "$OBSSPEC_MAX_PROCS" -v "$OBSSPEC_MEMORY_KB" -f "$OBSSPEC_FILE_BLOCKS"
state=$OBSSPEC_STATE_DIR

__kill_others() {
  # A fork bomb may still be forking while we kill, so repeat until nothing else is left.
  # Unsandboxed (isolation=none) we are not PID 1 and kill only the command's own session.
  local i
  for ((i = 0; i < 100; i++)); do
    if [ $$ = 1 ]; then kill -KILL -1 || return 0; else kill -KILL -- "-$pid" || return 0; fi
  done
}
__interrupted=0
trap '__interrupted=1' USR1

setsid=""
[ $$ = 1 ] || setsid=setsid

__restamp() {
  # Files the kernel stamped with the real time get the episode's logical clock instead, so that
  # `ls -l` and `find -newer` print the same thing in every episode.
  [ "$OBSSPEC_DETERMINISTIC" = 1 ] || return 0
  local roots=("$OBSSPEC_WORKDIR" /tmp "$HOME")
  [ $$ = 1 ] && roots+=(/)
  find "${roots[@]}" -xdev -newermt "@$OBSSPEC_HORIZON" \
    -exec touch -h -d "@$1" {} + 2>/dev/null
}

while IFS=' ' read -r op nonce nbytes arg; do
  script=""
  [ "$nbytes" -gt 0 ] && IFS= read -r -d '' -N "$nbytes" script
  printf '%s' "$script" > "$state/cmd"
  __interrupted=0
  if [ "$op" = run ]; then
    LC_ALL=$agent_lc_all $setsid bash --noprofile --norc -c "$OBSSPEC_RUNNER" bash "$arg" </dev/null 2>&1 &
  else
    (cd "$OBSSPEC_WORKDIR" && LC_ALL=$agent_lc_all exec $setsid bash --noprofile --norc "$state/cmd") </dev/null 2>&1 &
  fi
  pid=$!
  wait "$pid"; rc=$?
  while [ "$__interrupted" = 1 ]; do
    __interrupted=0
    __kill_others
    wait "$pid"; rc=$?
  done
  __restamp "$arg"
  printf '\0%s %d\0' "$nonce" "$rc"
done
