package flytest

// A fake Machine is a workspace of the local provider (providers/local):
// its main process runs as a durable command of that workspace, under
// bwrap, and with it an exec agent in the same pid namespace, so that
// processes an exec starts in the background live on like in a VM, and
// all of them die when the main process exits. Execs reach the agent
// through files and a FIFO under agentDir, from a short exec of the local
// provider each.

// agentDir is the agent's directory in the guest.
const agentDir = "/tmp/.flyfake"

// agentScript is the main command: it starts the agent and execs the
// Machine's init ("$@"). The agent reads "run ID" and "kill ID" lines
// from its FIFO. A run reads the request's argv (one base64 line per
// argument) and stdin from agentDir/r/ID, runs it as the leader of its
// own session with stdout and stderr to files, writes its exit status and
// wakes the waiting exec through the request's own FIFO.
const agentScript = `q=` + agentDir + `
rm -rf "$q"
mkdir -p "$q/r" && mkfifo "$q/fifo" || exit 1
(
	exec 3<>"$q/fifo"
	: >"$q/ready"
	while read -r op id <&3; do
		r=$q/r/$id
		case $op in
		run)
			(
				setsid sh -c '
					r=$1
					echo $$ >"$r/pid"
					set --
					while IFS= read -r l; do a=$(printf %s "$l" | base64 -d; echo x); set -- "$@" "${a%x}"; done <"$r/argv"
					exec "$@" <"$r/stdin" >"$r/out" 2>"$r/err"' sh "$r"
				echo $? >"$r/exit.tmp" && mv "$r/exit.tmp" "$r/exit"
				echo done 1<>"$r/done"
			) </dev/null >/dev/null 2>&1 &
			;;
		kill)
			p=$(cat "$r/pid" 2>/dev/null) && [ -n "$p" ] && kill -9 "-$p" 2>/dev/null
			;;
		esac
	done
) </dev/null >/dev/null 2>&1 &
exec "$@"
`

// submitScript gets $1 = the request id and $2 = the argv lines, stdin on
// its stdin. It hands the request to the agent, waits for it, and prints
// "exit STATUS OUTBYTES ERRBYTES", then stdout and stderr.
const submitScript = `q=` + agentDir + ` r=` + agentDir + `/r/$1
[ -e "$q/ready" ] || exit 91
mkdir -p "$r" && printf '%s\n' "$2" >"$r/argv" && cat >"$r/stdin" && mkfifo "$r/done" || exit 90
exec 4<>"$r/done"
echo "run $1" 1<>"$q/fifo"
read -r x <&4
read -r c <"$r/exit"
printf 'exit %s %s %s\n' "$c" "$(wc -c <"$r/out")" "$(wc -c <"$r/err")"
cat "$r/out" "$r/err"
rm -rf "$r"
`

// killScript gets $1 = a request id and has the agent kill its session.
const killScript = `echo "kill $1" 1<>` + agentDir + `/fifo`

// readyScript exits 0 once the agent reads its FIFO.
const readyScript = `[ -e ` + agentDir + `/ready ]`
