// Command kstatus prints how kstatus (sigs.k8s.io/cli-utils/pkg/kstatus, the library Flux's
// kustomize-controller and helm-controller use for health checks) reads each object of a JSON
// array on stdin: one line per object, "<status>\t<message>".
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading stdin: %v\n", err)
		os.Exit(2)
	}
	// Kubernetes' JSON decoding keeps integers int64, as unstructured objects need them.
	var objects []interface{}
	if err := json.Unmarshal(input, &objects); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading a JSON array of objects: %v\n", err)
		os.Exit(2)
	}
	for _, item := range objects {
		object, ok := item.(map[string]interface{})
		if !ok {
			fmt.Fprintln(os.Stderr, "kstatus: every element must be an object")
			os.Exit(2)
		}
		result, err := status.Compute(&unstructured.Unstructured{Object: object})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("%s\t%s\n", result.Status, result.Message)
	}
}
