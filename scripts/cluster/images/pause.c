/*
 * pause: the sandbox process of every pod on the local cluster (the kubelet's
 * --pod-infra-container-image, containerd's sandbox image). It holds the pod's
 * namespaces open, reaps the zombies it inherits as PID 1 of a shared PID namespace,
 * and exits 0 on SIGINT or SIGTERM. Built statically so that its image is this one file.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
	(void)sig;
	_exit(0);
}

static void on_child(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause (tidegate local cluster)");
		return 0;
	}
	if (getpid() != 1) {
		fprintf(stderr, "pause: warning: not PID 1\n");
	}
	struct sigaction stop = {.sa_handler = on_stop};
	struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
	if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
	    sigaction(SIGCHLD, &child, NULL) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;) {
		pause();
	}
}
