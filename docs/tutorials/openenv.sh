corrgrpo serve corrgrpo/ScaleDominance-v0 --port 8000 &      # any env as an OpenEnv server
SERVER=$!
curl -sf --retry 60 --retry-delay 1 --retry-connrefused http://127.0.0.1:8000/health
corrgrpo train remote.yaml                                  # -> runs/remote-corrgrpo-s0
kill $SERVER
