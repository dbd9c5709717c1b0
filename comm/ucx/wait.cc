#include "comm/ucx/wait.h"

// WaitForRequests is a template (wait.h).
