package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from go\n") })
	http.ListenAndServe("127.0.0.1:"+os.Args[1], nil)
}
